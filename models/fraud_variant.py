"""Train a second version of the fraud model into a directory, for demos of a rollout.

    python -m models.fraud_variant OUTPUT_DIR [--seed 1017]

Writes `OUTPUT_DIR/saved_model.pb, variables/, assets.extra/` (TF Serving's version directory):
the fraud example's MLP (`models.train_fraud`) trained with another seed on fewer rows (20,000,
4 epochs: about 10 s on one core), so its scores differ from the committed version 1 while its
signature is the same. It never writes under the repository's `models/`.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from models.train_fraud import build_model, export, seeded_data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path)
    parser.add_argument("--seed", type=int, default=1017)
    args = parser.parse_args()
    data = argparse.Namespace(train_rows=20_000, test_rows=5_000)
    train_x, train_y, test_x, test_y = seeded_data(data, args.seed)
    model = build_model(train_x)
    model.fit(train_x, train_y, epochs=4, batch_size=256, shuffle=True, verbose=0)
    _, auc = model.evaluate(test_x, test_y, batch_size=4096, verbose=0)
    print(f"fraud v2 (seed {args.seed}): held-out ROC AUC {auc:.4f}")
    export(model, args.output, test_x[:64])


if __name__ == "__main__":
    main()
