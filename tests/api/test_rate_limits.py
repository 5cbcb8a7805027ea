"""Per-client rate limits over real processes: gunicorn with two workers (as deployed) in front of
fake serving, two API keys each driven well over its limit by many short connections (so both
workers take each client's requests), the admitted count held within 10 % of what one token
bucket allows, each worker's share read from its own metrics file; 429 with Retry-After and the
error shape."""

from __future__ import annotations

import http.client
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.multiprocess import MultiProcessCollector

from tests.api.stack import FakeServing, start_fake, transactions
from tests.api.tokens import KeyFile, auth_env
from tests.support import Process, children_running, free_port, http_ok, start_gunicorn, wait_until

WORKERS = 2
RATE, BURST = 40.0, 20
LOAD_S = 3.0
CONNECTIONS_PER_CLIENT = 6
SCORE = "/v1/fraud/score"


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServing]:
    fake = start_fake(tmp_path_factory.mktemp("fake"), "fake")
    yield fake
    fake.proc.stop()


def per_worker(prom_dir: Path, pids: set[int]) -> dict[int, Counter[str]]:
    """Each worker's answers on the score route by status, from its own multiprocess file."""
    counts: dict[int, Counter[str]] = {}
    for pid in pids:
        files = [str(p) for p in prom_dir.glob(f"histogram_{pid}.db")]
        counts[pid] = Counter()
        for metric in MultiProcessCollector.merge(files) if files else []:
            for s in metric.samples:
                if s.name == "api_request_duration_seconds_count" and s.labels.get("route") == SCORE:
                    counts[pid][s.labels["status"]] += int(s.value)
    return counts


class Client(threading.Thread):
    """Sends score requests with one key, a new connection each, until `stop_at`."""

    def __init__(self, port: int, key: str, stop_at: float, body: bytes) -> None:
        super().__init__(daemon=True)
        self.port, self.key, self.stop_at, self.body = port, key, stop_at, body
        self.statuses: Counter[int] = Counter()
        self.first_sent = float("inf")
        self.last_answered = 0.0
        self.refusal: tuple[dict[str, str], bytes] | None = None

    def run(self) -> None:
        while time.monotonic() < self.stop_at:
            sent = time.monotonic()
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=10)
            try:
                conn.request("POST", SCORE, self.body, {"content-type": "application/json", "x-api-key": self.key,
                                                        "connection": "close"})  # fmt: skip
                response = conn.getresponse()
                body = response.read()
            finally:
                conn.close()
            self.first_sent = min(self.first_sent, sent)
            self.last_answered = time.monotonic()
            self.statuses[response.status] += 1
            if response.status == 429 and self.refusal is None:
                self.refusal = ({k.lower(): v for k, v in response.getheaders()}, body)


def test_a_limit_holds_across_two_workers_within_ten_percent(fake: FakeServing, tmp_path: Path) -> None:
    keys = KeyFile(tmp_path / "api-keys")
    key_a, key_b = keys.add("client-a"), keys.add("client-b")
    port = free_port()
    prom_dir = tmp_path / "prometheus"
    env = auth_env(keys=keys, extra=[("RATE_LIMITS__ROUTES", json.dumps({SCORE: {"rate": RATE, "burst": BURST}}))])
    gunicorn: Process = start_gunicorn(
        tmp_path / "gunicorn.log",
        WEB_CONCURRENCY=str(WORKERS),
        API_BIND=f"127.0.0.1:{port}",
        SERVING_URL=fake.url,
        PROMETHEUS_MULTIPROC_DIR=str(prom_dir),
        EVENTS_JSONL_PATH=str(tmp_path / "events.jsonl"),
        ACCESS_LOG="false",
        **env,
    )
    try:
        gunicorn.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 90, "/readyz")
        gunicorn.wait_ready(lambda: len(children_running(gunicorn.pid, "gunicorn")) == WORKERS, 30, "both workers")
        workers = children_running(gunicorn.pid, "gunicorn")
        body = json.dumps(transactions(1)[0]).encode()
        stop_at = time.monotonic() + LOAD_S
        clients = {
            key: [Client(port, key, stop_at, body) for _ in range(CONNECTIONS_PER_CLIENT)] for key in (key_a, key_b)
        }
        for threads in clients.values():
            for thread in threads:
                thread.start()
        for threads in clients.values():
            for thread in threads:
                thread.join(LOAD_S + 30)
        for threads in clients.values():
            statuses = sum((t.statuses for t in threads), Counter())
            window = max(t.last_answered for t in threads) - min(t.first_sent for t in threads)
            allowed = BURST + RATE * window
            assert set(statuses) == {200, 429}, statuses
            assert statuses[429] > statuses[200]  # the client did ask for more than its limit
            assert abs(statuses[200] - allowed) <= 0.1 * allowed, (statuses, window, allowed)
        headers, refused = next(t.refusal for t in clients[key_a] if t.refusal is not None)
        assert headers["retry-after"] == "1" and headers["content-type"] == "application/json"
        answer = json.loads(refused)
        assert set(answer) == {"detail", "code", "request_id"}
        assert answer["code"] == "rate_limited" and answer["request_id"] == headers["x-request-id"]
        assert answer["detail"] == f"rate limit of 40 requests/s (burst 20) on {SCORE} exceeded; retry after 1 s"
        # Both workers took requests of the load and admitted some of them: the bucket is shared
        # (counted per worker, each would admit its own 40/s and the total would be near twice that).
        wait_until(lambda: sum(sum(c.values()) for c in per_worker(prom_dir, workers).values()) >= sum(
            sum(t.statuses.values()) for threads in clients.values() for t in threads), 10, "every answer counted")
        shares = per_worker(prom_dir, workers)
        assert all(share["200"] > 0 and share["429"] > 0 for share in shares.values()), shares
    finally:
        gunicorn.stop()
