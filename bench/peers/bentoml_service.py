"""The BentoML peer: the fraud route as a user of BentoML 1.4 would write it.

    cd <repo> && PYTHONPATH=. .venv-peers/bentoml/bin/bentoml serve \
        bench.peers.bentoml_service:FraudScorer --host 127.0.0.1 --port 3000

Written after BentoML's own docs (BentoML 1.4, "Services" and "Adaptive batching"): one
`@bentoml.service` class that loads the model in `__init__` (once per worker), and one
`@bentoml.api(batchable=True)` method. A batchable API takes exactly one parameter that can
hold many requests (a list) and returns a list of the same length; BentoML's dispatcher
gathers concurrent requests into one call, bounded by `max_batch_size` (64, the split's
coalescing bound) and `max_latency_ms`, left at BentoML's default (60 s). Why not the SLO:
`max_latency_ms` is not a batch window but a shedding bound. BentoML's dispatcher
(`CorkDispatcher`) cancels the oldest queued request, answered 503, whenever its fitted
estimate `wait + a x queued + b` reaches it; at 25 ms a burst of 32 concurrent requests
sheds most of them, its fit learns from the shed burst, and the service settled at under
20 answers/s (closed loop 541, 50, 17, 19 per 2 s round). At the default it never sheds,
and a request late for the SLO is counted late by the benchmark rather than turned into
an error. The request body is
therefore `{"transactions": [<the route's Transaction>]}` and the answer a one-item list;
the load generator sends exactly that to this peer (`bench.setups`). The feature code and
the schema are the fraud route's; `workers` is `BENCH_WORKERS` (1 for the throughput runs:
the server CPU budget is one CPU on 2 cores), `resources={"cpu": ...}` the CPUs the peer is
pinned to, so BentoML sizes its thread variables from them.
"""

from __future__ import annotations

from typing import Any

import bentoml

from bench.peers.common import MAX_BATCH_SIZE, SavedModelScorer, answer, env_int, features
from examples.fraud.schemas import Transaction


@bentoml.service(
    workers=env_int("BENCH_WORKERS", 1),
    resources={"cpu": str(env_int("BENCH_CPUS", 1))},
    traffic={"timeout": 10},
)
class FraudScorer:
    """Scores transactions with the fraud SavedModel, requests batched adaptively."""

    def __init__(self) -> None:
        self.model = SavedModelScorer()

    @bentoml.api(
        route="/v1/fraud/score",
        batchable=True,
        max_batch_size=MAX_BATCH_SIZE,
    )
    def score(self, transactions: list[Transaction]) -> list[dict[str, Any]]:
        """One batch: features per transaction, one model call, one answer per transaction."""
        scores = self.model([features(t) for t in transactions])
        return [answer(t, s) for t, s in zip(transactions, scores, strict=True)]
