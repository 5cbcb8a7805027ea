"""Helpers for the API tests that start real processes: fake serving, the API, load.

`tests.api.fake_serving` stands in for the serving tier where a test needs to hold,
kill or count predicts; `expected_score` is what it answers for a transaction.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from models.transactions import generate_transactions
from tests.api.fake_serving import fake_score
from tests.support import Process, free_port, http_ok, start_api


def transactions(n: int, seed: int = 7) -> list[dict[str, Any]]:
    """n raw transaction bodies (models.transactions)."""
    return [t.body for t in generate_transactions(n, seed=seed, fraud_rate=0.3)]


def expected_score(body: dict[str, Any]) -> float:
    """What fake serving answers for this transaction (float64 features)."""
    return fake_score(extract_features(Transaction.model_validate(body)))


def get_json(url: str) -> Any:
    return httpx.get(url, timeout=5).json()


@dataclass
class FakeServing:
    """A running `tests.api.fake_serving` process."""

    proc: Process
    rest_port: int
    grpc_port: int = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    def stats(self) -> dict[str, Any]:
        return get_json(self.url + "/_fake/stats")  # type: ignore[no-any-return]

    def hold(self) -> None:
        httpx.post(self.url + "/_fake/hold", timeout=5).raise_for_status()

    def release(self) -> None:
        httpx.post(self.url + "/_fake/release", timeout=5).raise_for_status()


def launch_fake(
    tmp: Path, name: str, rest_port: int | None = None, grpc_port: int = 0, *extra: str
) -> FakeServing:
    """Start fake serving without waiting for it (see `wait_ready`); `extra`: more flags."""
    rest_port = rest_port or free_port()
    args = [sys.executable, "-m", "tests.api.fake_serving", f"--rest-port={rest_port}", *extra]
    if grpc_port:
        args.append(f"--grpc-port={grpc_port}")
    proc = Process(args, tmp / f"{name}.log", env={"TF_CPP_MIN_LOG_LEVEL": "3"})
    return FakeServing(proc, rest_port, grpc_port)


def wait_ready(*fakes: FakeServing) -> None:
    """Wait until each fake answers model status (it starts REST after gRPC)."""
    for fake in fakes:
        fake.proc.wait_ready(lambda fake=fake: http_ok(fake.url + "/v1/models/fraud"), 120, "model status")


def start_fake(tmp: Path, name: str, rest_port: int | None = None, grpc_port: int = 0) -> FakeServing:
    """Start fake serving and wait until it answers (with gRPC it loads TensorFlow first)."""
    fake = launch_fake(tmp, name, rest_port, grpc_port)
    wait_ready(fake)
    return fake


@dataclass
class Api:
    """A running API process (one uvicorn worker)."""

    proc: Process
    url: str


def start_api_process(tmp: Path, name: str, serving_url: str, ready_path: str = "/readyz", **env: str) -> Api:
    """Start the API and wait until `ready_path` is 200 (/readyz: serving reachable, every
    route's model AVAILABLE with its signature; /healthz: the process is up)."""
    port = free_port()
    env = {"EVENTS_JSONL_PATH": str(tmp / f"{name}-events.jsonl"), "ACCESS_LOG": "false", **env}
    proc = start_api(port, serving_url, tmp / f"{name}.log", **env)
    api = Api(proc, f"http://127.0.0.1:{port}")
    proc.wait_ready(lambda: http_ok(api.url + ready_path), 60, ready_path)
    return api


@dataclass
class Outcome:
    """One request of a load run."""

    index: int
    status: int
    body: Any
    headers: httpx.Headers
    elapsed_s: float


@dataclass
class LoadRun:
    outcomes: list[Outcome] = field(default_factory=list)

    def statuses(self) -> dict[int, int]:
        counts: dict[int, int] = {}
        for o in self.outcomes:
            counts[o.status] = counts.get(o.status, 0) + 1
        return counts


def run_load(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int,
    max_seconds: float,
    headers: dict[str, str] | None = None,
    on_done: Callable[[int], None] | None = None,
) -> LoadRun:
    """POST each body to `url` with `concurrency` callers; stop early after `max_seconds`.

    `on_done(completed)` runs after each answer (on the event loop: keep it quick).
    Bounded in count (len(bodies)) and time (max_seconds; each request also has a 10 s
    client timeout), loopback only.
    """
    run = LoadRun()
    queue = list(enumerate(bodies))
    stop_at = time.monotonic() + max_seconds

    async def caller(client: httpx.AsyncClient) -> None:
        while queue and time.monotonic() < stop_at:
            index, body = queue.pop(0)
            began = time.monotonic()
            response = await client.post(url, json=body, headers=headers)
            try:
                payload = response.json()
            except ValueError:
                payload = response.text
            run.outcomes.append(
                Outcome(index, response.status_code, payload, response.headers, time.monotonic() - began)
            )
            if on_done is not None:
                on_done(len(run.outcomes))

    async def main() -> None:
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=10.0, limits=limits) as client:
            await asyncio.gather(*(caller(client) for _ in range(concurrency)))

    asyncio.run(main())
    return run


def run_load_with_a_replica_hung(
    url: str, victim: FakeServing, bodies: Sequence[dict[str, Any]], *, after: int, concurrency: int
) -> LoadRun:
    """`run_load`, with `victim` SIGSTOPped once `after` answers are in and SIGCONTed at the end.

    A stopped process's kernel still accepts connections and takes requests; nothing answers.
    """

    def hang(done: int) -> None:
        if done == after:
            os.kill(victim.proc.popen.pid, signal.SIGSTOP)

    try:
        return run_load(url, bodies, concurrency=concurrency, max_seconds=90, on_done=hang)
    finally:
        os.kill(victim.proc.popen.pid, signal.SIGCONT)
