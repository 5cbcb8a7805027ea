"""Train the `fraud` example model and export it in TF Serving's layout.

    python -m models.train_fraud [--output models/fraud] [--version 1]

Generates raw transactions (`models.transactions`), maps them through the API's own
feature definition (`examples.fraud.features.extract_features`), trains a small Keras MLP,
prints the ROC AUC on a held-out split, and writes:

    <output>/<version>/saved_model.pb, variables/        the servable
    <output>/<version>/assets.extra/tf_serving_warmup_requests
                                                         PredictionLog records that
                                                         TF Serving replays with
                                                         --enable_model_warmup

Signature `serving_default` (stable, documented in the README):
    inputs:  features     float32 [batch, N_FEATURES]  in examples.fraud.features.FEATURE_NAMES order
    outputs: fraud_score  float32 [batch, 1]           probability of fraud, 0..1

Seeds are fixed, ops deterministic and one thread, so on a machine whose kernels run the
instruction set the committed export was trained with (`models.kernels`) the script reproduces
it: the same outputs to the last float32 bit, which it checks before it keeps the committed
files (`models.export.publish`). On the other kind (AVX2 vs AVX-512) it reproduces the AUC and
every decision, within `CROSS_KIND` (measured under `ONEDNN_MAX_CPU_ISA=AVX2`: 20,000 of 20,000
held-out rows decided alike, max |difference| of the scores 3.6e-7).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# Fewer kernels that depend on the CPU: oneDNN's graph rewrites and custom ops off (before
# TensorFlow is imported). Matrix products still run on oneDNN's sgemm, which picks its code by
# the instruction set (models.kernels): that is what differs between kinds of CPU.
os.environ["TF_ENABLE_ONEDNN_OPTS"] = "0"

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from examples.fraud.features import FEATURE_NAMES, N_FEATURES, extract_batch  # noqa: E402
from examples.fraud.schemas import Transaction  # noqa: E402
from models.export import CrossKindTolerance, export_servable, publish, staging_dir, write_warmup  # noqa: E402
from models.transactions import generate_transactions  # noqa: E402

SEED = 20261129
# Between kinds of kernels: the same decision (score >= 0.5) for 99 % of the probe rows, and a
# mean difference of the scores no larger than the digits example allows (fraud measured 2.5e-9
# between AVX-512 and AVX2, the transformer 1.5e-4).
CROSS_KIND = CrossKindTolerance(
    decide=lambda outputs: outputs["fraud_score"][:, 0] >= 0.5,
    min_agreement=0.99,
    max_mean_abs_difference=0.005,
)
INPUT_NAME = "features"
OUTPUT_NAME = "fraud_score"
SIGNATURE = "serving_default"


def dataset(n: int, seed: int, start_index: int) -> tuple[np.ndarray, np.ndarray]:
    """Features [n, N_FEATURES] float32 and labels [n] float32 from generated traffic."""
    rows = generate_transactions(n, seed=seed, start_index=start_index)
    x = np.asarray(
        extract_batch([Transaction.model_validate(r.body) for r in rows]), dtype=np.float32
    )
    y = np.asarray([r.is_fraud for r in rows], dtype=np.float32)
    return x, y


def command_line(description: str, output: Path, epochs: int) -> argparse.Namespace:
    """The fraud trainers' command line: --output, --version, --train-rows, --test-rows,
    --epochs (defaults: `output`, 1, 60,000, 20,000, `epochs`)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--output", type=Path, default=output)
    parser.add_argument("--version", type=int, default=1)
    parser.add_argument("--train-rows", type=int, default=60_000)
    parser.add_argument("--test-rows", type=int, default=20_000)
    parser.add_argument("--epochs", type=int, default=epochs)
    return parser.parse_args()


def seeded_data(
    args: argparse.Namespace, seed: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Seed Keras and make TensorFlow's ops deterministic, then (train_x, train_y, test_x,
    test_y) from `dataset`, the test rows drawn after the training rows."""
    keras.utils.set_random_seed(seed)
    tf.config.experimental.enable_op_determinism()
    # One thread: a kernel may split a sum across its threads, so the thread count (the
    # machine's cores) would change the last bits of the weights.
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    train_x, train_y = dataset(args.train_rows, seed=seed, start_index=0)
    test_x, test_y = dataset(args.test_rows, seed=seed + 1, start_index=args.train_rows)
    print(f"train rows {len(train_y)} (fraud {train_y.mean():.3f}), test rows {len(test_y)}")
    return train_x, train_y, test_x, test_y


def build_model(train_x: np.ndarray) -> keras.Model:
    """MLP: Normalization (adapted on train_x) -> 32 -> 16 -> 1 sigmoid."""
    norm = keras.layers.Normalization(name="normalize")
    norm.adapt(train_x)
    inputs = keras.Input(shape=(N_FEATURES,), name=INPUT_NAME, dtype="float32")
    h = norm(inputs)
    h = keras.layers.Dense(32, activation="relu")(h)
    h = keras.layers.Dense(16, activation="relu")(h)
    out = keras.layers.Dense(1, activation="sigmoid", name=OUTPUT_NAME)(h)
    model = keras.Model(inputs, out, name="fraud")
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss="binary_crossentropy",
        metrics=[keras.metrics.AUC(name="auc", num_thresholds=2000)],
    )
    return model


def export(model: keras.Model, version_dir: Path, warmup_rows: np.ndarray) -> None:
    """Write the SavedModel with named input/output, plus the warmup records."""
    export_servable(
        model,
        version_dir,
        signature_name=SIGNATURE,
        input_spec=tf.TensorSpec([None, N_FEATURES], tf.float32, name=INPUT_NAME),
        output_name=OUTPUT_NAME,
    )
    write_warmup(
        version_dir, model_name="fraud", signature_name=SIGNATURE, inputs={INPUT_NAME: warmup_rows}
    )


def main() -> None:
    args = command_line(__doc__.splitlines()[0], Path("models/fraud"), epochs=8)
    print(f"features ({N_FEATURES}): {', '.join(FEATURE_NAMES)}")
    train_x, train_y, test_x, test_y = seeded_data(args, SEED)

    model = build_model(train_x)
    model.fit(train_x, train_y, epochs=args.epochs, batch_size=256, shuffle=True, verbose=0)
    _, auc = model.evaluate(test_x, test_y, batch_size=4096, verbose=0)
    print(f"held-out ROC AUC: {auc:.4f}")

    version_dir = args.output / str(args.version)
    staged = staging_dir(version_dir)
    export(model, staged, test_x[:64])
    print(publish(staged, version_dir, signature_name=SIGNATURE, probe={INPUT_NAME: test_x}, tolerance=CROSS_KIND))
    print(f"signature {SIGNATURE}: {INPUT_NAME} -> {OUTPUT_NAME}")


if __name__ == "__main__":
    main()
