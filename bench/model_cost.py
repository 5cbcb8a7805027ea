"""`python -m bench.model_cost`: the model's own cost per call in-process, by batch size.

    taskset -c 0 python -m bench.model_cost --model-dir models/fraud_transformer/1 --batches 1,8,32

Loads the SavedModel the way the tuned setup does (`bench.apps.tuned.SessionModel`: a
`Session.make_callable` over the `serve` MetaGraph, one intra- and one inter-op thread)
and times one call per batch size: a few warm calls, then calls until `--min-s` seconds
have passed (at least `--min-calls`), and prints one JSON object
`{"batch_ms": {"1": median ms per call, ...}, "threads": 1}`. The benchmark runs it pinned
to the server CPUs, before a workload's setups (`bench.runner`), so the heavier model's
1-CPU limit can be estimated from what one row costs at the batch sizes the SLO allows
(`bench.goals.one_cpu_limit`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

DEFAULT_BATCHES = (1, 2, 4, 8, 16, 32, 64)


def time_batches(model_dir: Path, batches: Sequence[int], *, min_s: float, min_calls: int) -> dict[int, float]:
    """Median milliseconds per call of the model at each batch size (rows of zeros plus a
    little noise: the cost of these models does not depend on the values)."""
    for name in ("OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
        os.environ.setdefault(name, "1")
    import numpy as np

    from bench.apps.tuned import SessionModel
    from examples.fraud.features import N_FEATURES

    model = SessionModel(model_dir, threads=1)
    rng = np.random.default_rng(2026)
    out: dict[int, float] = {}
    for batch in batches:
        rows = (rng.standard_normal((batch, N_FEATURES)) * 0.1).astype(np.float32).tolist()
        for _ in range(3):
            model(rows)
        times: list[float] = []
        started = time.perf_counter()
        while len(times) < min_calls or time.perf_counter() - started < min_s:
            t = time.perf_counter()
            model(rows)
            times.append((time.perf_counter() - t) * 1e3)
        out[batch] = statistics.median(times)
    model.close()
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Print the JSON described in the module docstring; 2 on a bad command line."""
    parser = argparse.ArgumentParser(prog="python -m bench.model_cost", description=__doc__.splitlines()[0])
    parser.add_argument("--model-dir", type=Path, required=True, help="a SavedModel version directory")
    parser.add_argument("--batches", default=",".join(map(str, DEFAULT_BATCHES)))
    parser.add_argument("--min-s", type=float, default=0.3, help="seconds of calls per batch size at least")
    parser.add_argument("--min-calls", type=int, default=10)
    args = parser.parse_args(argv)
    try:
        batches = [int(b) for b in args.batches.split(",") if b.strip()]
    except ValueError:
        print("python -m bench.model_cost: --batches takes integers, e.g. 1,8,32", file=sys.stderr)
        return 2
    if not batches or min(batches) < 1:
        print("python -m bench.model_cost: batch sizes must be >= 1", file=sys.stderr)
        return 2
    costs = time_batches(args.model_dir, batches, min_s=args.min_s, min_calls=args.min_calls)
    print(json.dumps({"batch_ms": {str(b): round(ms, 4) for b, ms in costs.items()}, "threads": 1}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
