"""The Ray Serve peer: the fraud route as a user of Ray Serve 2.x would write it.

    cd <repo> && PYTHONPATH=. BENCH_PORT=8000 BENCH_MODEL_DIR=models/fraud/1 \
        .venv-peers/ray-serve/bin/python -m bench.peers.ray_serve_app

Written after Ray Serve's docs ("Set Up FastAPI and HTTP", "Dynamic Request Batching"): one
deployment with a FastAPI ingress (`@serve.ingress`) whose route takes the route's own
`Transaction` body, extracts its features and awaits a `@serve.batch` method, which Ray
Serve calls with the features of concurrent requests as one list (at most `max_batch_size`).
`batch_wait_timeout_s` is 0: a batch holds what queued while the previous one ran (the model
call blocks the replica's user-code loop, so under load the queue fills by itself) and a
lone request waits for nothing, as with the split's coalescing. Ray's default of 10 ms (or
a share of the SLO) is a timer every batch waits out when it is not full: it added its
whole length to every request at low and moderate load. `max_ongoing_requests` is raised to `max_batch_size`: at Ray's
default of 5 a replica never holds more than 5 requests, so no batch could hold more (Ray's
docs tell batching users to set the two together). `num_replicas` is `BENCH_WORKERS` (1 for
the throughput runs), each replica's `num_cpus` the peer's CPUs shared among them. The script starts a local Ray
instance on those CPUs (no dashboard, usage stats off), runs the app with Serve's HTTP proxy
on 127.0.0.1:`BENCH_PORT`, prints `ray-serve peer ready` and serves until SIGTERM or SIGINT,
then shuts Serve and Ray down.
"""

# No `from __future__ import annotations` here: FastAPI reads the route's body type from the
# method's annotations, which Serve's ingress wrapper leaves unresolved when they are strings
# (the body then became a query parameter).
import os
import signal
import threading
from typing import Any

import ray
from fastapi import FastAPI
from ray import serve

from bench.peers.common import MAX_BATCH_SIZE, SavedModelScorer, answer, env_int, features
from examples.fraud.schemas import Transaction

READY = "ray-serve peer ready"
app = FastAPI()
REPLICAS = env_int("BENCH_WORKERS", 1)
CPUS = env_int("BENCH_CPUS", 1)


@serve.deployment(
    num_replicas=REPLICAS,
    max_ongoing_requests=MAX_BATCH_SIZE,
    ray_actor_options={"num_cpus": CPUS / REPLICAS},
)
@serve.ingress(app)
class FraudScorer:
    """Scores transactions with the fraud SavedModel; concurrent requests batched by Serve."""

    def __init__(self) -> None:
        self.model = SavedModelScorer()

    @serve.batch(max_batch_size=MAX_BATCH_SIZE, batch_wait_timeout_s=0.0)
    async def score_batch(self, rows: list[list[float]]) -> list[float]:
        """One model call for the rows of concurrent requests."""
        return self.model(rows)

    @app.post("/v1/fraud/score")
    async def score(self, transaction: Transaction) -> dict[str, Any]:
        """The route: validate (FastAPI, the route's schema), features, the batched model."""
        return answer(transaction, await self.score_batch(features(transaction)))


def main() -> None:
    """Start Ray and Serve on this host, serve until a signal, shut down."""
    # Everything on loopback: Ray's own processes talk to each other on the node address.
    ray.init(num_cpus=CPUS, include_dashboard=False, log_to_driver=False, _node_ip_address="127.0.0.1")
    serve.start(http_options={"host": "127.0.0.1", "port": env_int("BENCH_PORT", 8000)})
    serve.run(FraudScorer.bind(), name="fraud", route_prefix="/")
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(READY, flush=True)
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    main()
