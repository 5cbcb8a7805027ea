"""What both peers' service files share: the model loaded the TensorFlow 2 way, and the answer.

Runs inside a peer's venv (`bench.peers`): imports TensorFlow, NumPy and the fraud route's
schemas and feature code, nothing else of the benchmark.

Environment (set by `bench.setups` when it starts a peer): `BENCH_MODEL_DIR` (the SavedModel
version directory), `BENCH_WORKERS` (BentoML workers / Ray Serve replicas), `BENCH_SLO_MS` (the
workload's SLO; neither peer's batcher is bounded by it, their service files say why),
`BENCH_CPUS` (CPUs the peer
may use), `BENCH_PORT`.
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from typing import Any

from examples.fraud.features import N_FEATURES, extract_features
from examples.fraud.schemas import Transaction

#: Rows per batch at most: the API's coalescing default (COALESCING_MAX_BATCH_ROWS).
MAX_BATCH_SIZE = 64
THRESHOLD = 0.5


def env_int(name: str, default: int) -> int:
    """An integer from the environment."""
    return int(os.environ.get(name) or default)


def slo_ms() -> float:
    """The workload's SLO in ms (`BENCH_SLO_MS`, default 25)."""
    return float(os.environ.get("BENCH_SLO_MS") or 25.0)


class SavedModelScorer:
    """The SavedModel's `serving_default` signature, loaded with `tf.saved_model.load` (the
    TensorFlow 2 way a BentoML or Ray Serve user loads one), one intra- and one inter-op
    thread (as the tuned setup: one busy thread per CPU of the budget), and the heap loaded
    so far frozen out of the garbage collector's scans (`gc.freeze`).

    Call with feature rows [n, N_FEATURES] (float32); returns n scores.
    """

    def __init__(self, model_dir: str | None = None) -> None:
        import tensorflow as tf

        tf.config.threading.set_intra_op_parallelism_threads(1)
        tf.config.threading.set_inter_op_parallelism_threads(1)
        self._tf = tf
        loaded = tf.saved_model.load(model_dir or os.environ["BENCH_MODEL_DIR"])
        self._loaded = loaded  # the signature's variables live as long as this object
        self._signature = loaded.signatures["serving_default"]
        self._input = next(iter(self._signature.structured_input_signature[1]))
        self._output = next(iter(self._signature.structured_outputs))
        self([[0.0] * N_FEATURES])  # trace once before the first request
        # Out of the garbage collector's scans, as the serving tier does after loading
        # (serving.model_servers.server._freeze_heap): BentoML's worker, 130 RPS of fraud on
        # one CPU, ran a full collection every ~8.5 s, each scanning TensorFlow's long-lived
        # objects for 190-220 ms; every request in flight waited it out (p99 62-74 ms, max
        # 150-230 ms), so whether a search step passed depended on whether a pause landed in
        # it (two runs: 315 and 127 SLO-RPS). Frozen: the same collections took ~25 ms, p99
        # 14-15 ms, max 37-56 ms. Not in either peer's docs; measured here at their best.
        gc.collect()
        gc.freeze()

    def __call__(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """Scores of `rows` (float32 [n, N_FEATURES]) as n floats."""
        tensor = self._tf.constant(rows, dtype=self._tf.float32)
        out = self._signature(**{self._input: tensor})[self._output]  # [n, 1]
        return [float(v) for v in out.numpy()[:, 0]]


def features(transaction: Transaction) -> list[float]:
    """The fraud route's own feature extraction."""
    return extract_features(transaction)


def answer(transaction: Transaction, score: float) -> dict[str, Any]:
    """The route's answer fields (transaction_id, fraud_score, is_fraud)."""
    value = min(1.0, max(0.0, score))
    return {"transaction_id": transaction.transaction_id, "fraud_score": value, "is_fraud": value >= THRESHOLD}
