"""Rollouts over real processes: the API (gunicorn, as deployed) in front of serving replicas.

- a canary's split over 10,000 users is within 1.5 points of its weight, and a user never
  switches arm while the weight holds;
- a rollback to 0 % through the rollout file is in force on every worker within 1 s, under
  load, with no failed request;
- a shadow that is missing, failing or hung never changes a primary answer or its status;
- a replica that does not have the target version AVAILABLE (still loading it, or unloaded
  it) is never sent it, over REST and gRPC;
- labels against our TF-Serving-compatible server (`version_labels` in models.config): the
  rollout's targets by label over REST (`/labels/L`) and gRPC (`version_label`).

Serving here is `tests.api.fake_serving` (TF Serving's REST and gRPC APIs, with versions and
states it can be told to change, and per-version counts), except for the labels, which run on
`python -m serving` with two versions of the fraud export.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from tests.api.fake_serving import fake_score
from tests.api.stack import FakeServing, launch_fake, transactions, wait_ready
from tests.support import Process, free_port, http_ok, start_gunicorn, wait_until

FRAUD_ROUTE = "examples.fraud.route:route"
SCORE = "/v1/fraud/score"


@dataclass
class Answer:
    """One request: when it was sent (wall clock), how it was answered."""

    sent_at: float
    status: int
    arm: str | None
    version: int | None
    user: str
    score: float | None
    elapsed_s: float


class Connection:
    """One keep-alive HTTP/1.1 connection on loopback, written and parsed by hand: httpx costs
    about 2.6 ms of CPU per request on this 2-core machine, this a tenth of it, and the API's
    own work is what the tests load."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, host: str) -> None:
        self.reader, self.writer, self.host = reader, writer, host

    @classmethod
    async def open(cls, url: str) -> Connection:
        host, _, port = url.removeprefix("http://").partition(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        return cls(reader, writer, f"{host}:{port}")

    async def post(self, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        """(status, headers with lower-case names, body); the connection stays open."""
        head = f"POST {path} HTTP/1.1\r\nhost: {self.host}\r\ncontent-type: application/json\r\n"
        head += "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.writer.write(f"{head}content-length: {len(body)}\r\n\r\n".encode() + body)
        status_line, *lines = (await self.reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        answer = {}
        for line in lines:
            name, sep, value = line.partition(":")
            if sep:
                answer[name.strip().lower()] = value.strip()
        return int(status_line.split()[1]), answer, await self.reader.readexactly(int(answer["content-length"]))

    def close(self) -> None:
        self.writer.close()


def send(
    url: str,
    bodies: Sequence[dict[str, Any]],
    *,
    concurrency: int = 16,
    stop: threading.Event | None = None,
    headers: dict[str, str] | None = None,
    max_seconds: float = 300.0,
    into: list[Answer] | None = None,
) -> list[Answer]:
    """POST each body (cycling through them until `stop` is set, when given), on `concurrency`
    connections; every answer with its arm and version, appended to `into` (when given) as it
    comes. Bounded in count (the bodies, or until `stop`) and time (`max_seconds`; each request
    10 s), loopback only."""
    answers: list[Answer] = into if into is not None else []
    limit = time.monotonic() + max_seconds
    encoded = [(b["user_id"], json.dumps(b).encode()) for b in bodies]

    async def caller(queue: list[tuple[str, bytes]]) -> None:
        connection = await Connection.open(url)
        i = 0
        try:
            while time.monotonic() < limit:
                if stop is None:
                    if not queue:
                        return
                    user, body = queue.pop()
                else:
                    if stop.is_set():
                        return
                    user, body = encoded[i % len(encoded)]
                    i += 1
                sent, began = time.time(), time.monotonic()
                async with asyncio.timeout(10):
                    status, answer, raw = await connection.post(SCORE, body, headers or {})
                payload = json.loads(raw) if status == 200 else {}
                answers.append(
                    Answer(
                        sent, status, answer.get("x-model-arm"), payload.get("model", {}).get("version"),
                        user, payload.get("fraud_score"), time.monotonic() - began,
                    )
                )  # fmt: skip
        finally:
            connection.close()

    async def main() -> None:
        queue = list(reversed(encoded))
        await asyncio.gather(*(caller(queue) for _ in range(concurrency)))

    asyncio.run(main())
    return answers


def distinct_users(n: int, seed: int = 11) -> list[dict[str, Any]]:
    """n transactions, each from its own user."""
    bodies = transactions(n, seed=seed)
    for i, body in enumerate(bodies):
        body["user_id"] = f"user-{seed}-{i}"
    return bodies


def write_rollouts(path: Path, rollouts: dict[str, Any]) -> float:
    """Replace the rollout file atomically (write, then rename over it); the time it was done."""
    staged = path.with_suffix(".staged")
    staged.write_text(json.dumps(rollouts))
    staged.replace(path)
    return time.time()


def applied(proc: Process, text: str) -> dict[int, float]:
    """Worker pid -> when it logged putting a rollout containing `text` in force (wall clock)."""
    found: dict[int, float] = {}
    for line in proc.log(None).splitlines():
        if line.startswith("{") and '"rollout of route' in line and text in line:
            record = json.loads(line)
            found[record["worker_pid"]] = datetime.fromisoformat(record["ts"].replace("Z", "+00:00")).timestamp()
    return found


@pytest.fixture
def fake(tmp_path: Path) -> Iterator[FakeServing]:
    versions = '--versions={"fraud": {"1": "AVAILABLE", "2": "AVAILABLE"}}'
    serving = launch_fake(tmp_path, "serving", None, 0, "--models=fraud", versions)
    wait_ready(serving)
    yield serving
    serving.proc.stop()


def gunicorn_api(tmp_path: Path, name: str, workers: int, **env: str) -> tuple[Process, str]:
    port = free_port()
    proc = start_gunicorn(
        tmp_path / f"{name}.log",
        API_BIND=f"127.0.0.1:{port}",
        WEB_CONCURRENCY=str(workers),
        MODEL_ROUTES=FRAUD_ROUTE,
        EVENTS_JSONL_PATH=str(tmp_path / f"{name}-events.jsonl"),
        ACCESS_LOG="false",
        **env,
    )
    url = f"http://127.0.0.1:{port}"
    proc.wait_ready(lambda: http_ok(url + "/readyz"), 90, "/readyz")
    return proc, url


def test_a_canary_splits_by_user_sticks_and_rolls_back_within_a_second_on_every_worker(
    tmp_path: Path, fake: FakeServing
) -> None:
    rollouts = tmp_path / "rollouts.json"
    write_rollouts(rollouts, {"fraud": {"stable": 1, "canary": 2, "canary_weight": 10}})
    api, url = gunicorn_api(tmp_path, "api", 2, SERVING_URL=fake.url, ROLLOUTS__FILE=str(rollouts))
    try:
        users = distinct_users(10_000)
        answers = send(url, users)
        assert Counter(a.status for a in answers) == {200: 10_000}
        arms = {a.user: (a.arm, a.version) for a in answers}
        assert set(arms.values()) == {("stable", 1), ("canary", 2)}
        share = 100 * sum(arm == "canary" for arm, _ in arms.values()) / len(arms)
        assert abs(share - 10) <= 1.5, share
        # The version's answer, not only its label: fake serving's score shifts with the version.
        by_user = {u["user_id"]: u for u in users}
        for a in answers[:200]:
            assert a.score == pytest.approx(expected(by_user[a.user], a.version), rel=1e-6)

        # Sticky: the same users again, on both workers, with the weight unchanged.
        again = send(url, users[:2_000] * 2)
        assert all(a.status == 200 and (a.arm, a.version) == arms[a.user] for a in again)

        # Rollback under load: every worker has it within 1 s; nothing fails meanwhile.
        stop = threading.Event()
        during: list[Answer] = []
        load = threading.Thread(target=send, args=(url, users), kwargs={"concurrency": 8, "stop": stop, "into": during})
        load.start()
        try:
            # Under way, with the canary serving some of it (10 % of users): then roll back.
            wait_until(lambda: any(a.arm == "canary" for a in during) or not load.is_alive(), 30, "canary answers")
            rolled_back = write_rollouts(rollouts, {"fraud": {"stable": 1, "canary": 2, "canary_weight": 0}})
            wait_until(lambda: len(applied(api, "at 0%")) == 2, 30, "both workers to apply the rollback")
            done = applied(api, "at 0%")
            wait_until(lambda: any(a.sent_at > rolled_back + 1.5 for a in during), 30, "load after the rollback")
        finally:
            stop.set()
            load.join(30)
        assert all(ts - rolled_back <= 1.0 for ts in done.values()), (done, rolled_back)
        assert Counter(a.status for a in during) == {200: len(during)}
        late = [a for a in during if a.sent_at > rolled_back + 1.0]
        assert late and {(a.arm, a.version) for a in late} == {("stable", 1)}
        assert any(a.arm == "canary" for a in during if a.sent_at < rolled_back)
    finally:
        api.stop()


def expected(body: dict[str, Any], version: int | None) -> float:
    """What fake serving answers for `body` at `version` (the features as REST sends them)."""
    return fake_score(extract_features(Transaction.model_validate(body)), version or 1)
