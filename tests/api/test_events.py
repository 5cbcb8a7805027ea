"""Score events: bounded queue, batching writer, sinks, drain on shutdown.

Unit tests drive `EventPublisher` through its `EventSink` seam (a file on tmp_path, an
`httpx.MockTransport`, or a sink that holds writes until released); the last test runs
the real serving tier and API processes and SIGTERMs the API.
"""

from __future__ import annotations

import asyncio
import json
import re
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from api.observability.events import EventPublisher, HttpSink, JsonlFileSink, ScoreEvent, encode_jsonl
from api.observability.metrics import ApiMetrics
from models.transactions import generate_transactions
from tests.support import (
    REPO,
    Process,
    Serving,
    free_port,
    http_ok,
    start_api,
    wait_until,
)

FIELDS = {
    "ts",
    "request_id",
    "route",
    "model_name",
    "model_version",
    "input_id",
    "outputs",
    "latency_ms",
    "fields",
    "arm",
}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def event(i: int) -> ScoreEvent:
    return ScoreEvent(
        ts=1_795_000_000.5 + i,
        request_id=f"req-{i}",
        route="fraud",
        model_name="fraud",
        model_version=1,
        input_id=f"t-{i}",
        outputs={"fraud_score": [i / 100]},
        latency_ms=1.25 + i,
        fields={"is_fraud": i >= 50},
    )


def outcome_counts(metrics: ApiMetrics) -> dict[str, float]:
    text = metrics.exposition()[0].decode()
    return {
        s.labels["outcome"]: s.value
        for f in text_string_to_metric_families(text)
        if f.name == "api_score_events"
        for s in f.samples
        if s.name == "api_score_events_total"
    }


class HeldSink:
    """An `EventSink` whose writes wait until `release` is set; records every batch."""

    def __init__(self, fail_first: int = 0) -> None:
        self.release = asyncio.Event()
        self.batches: list[list[ScoreEvent]] = []
        self.closed = False
        self._fail_first = fail_first

    async def write(self, events: Sequence[ScoreEvent]) -> None:
        await self.release.wait()
        if self._fail_first:
            self._fail_first -= 1
            raise OSError("disk full")
        self.batches.append(list(events))

    async def aclose(self) -> None:
        self.closed = True


def test_jsonl_encoding_one_object_per_line() -> None:
    data = encode_jsonl([event(1), event(2)])
    lines = data.decode().splitlines()
    assert data.endswith(b"\n") and len(lines) == 2
    first = json.loads(lines[0])
    assert set(first) == FIELDS
    assert first["ts"] == "2026-11-18T11:06:41.500Z"
    assert first["request_id"] == "req-1" and first["model_version"] == 1
    assert encode_jsonl([]) == b""


@pytest.mark.anyio
async def test_file_sink_gets_every_event_in_order_after_close(tmp_path: Path) -> None:
    metrics = ApiMetrics()
    path = tmp_path / "sub" / "events.jsonl"
    pub = EventPublisher(JsonlFileSink(path), metrics, max_queue=100, batch_size=7, linger_s=0.001)
    pub.start()
    for i in range(30):
        assert pub.publish(event(i))
    await pub.aclose()
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["input_id"] for r in rows] == [f"t-{i}" for i in range(30)]
    assert outcome_counts(metrics)["written"] == 30
    assert not pub.publish(event(99))  # closed: dropped, not queued
    await pub.aclose()  # idempotent


@pytest.mark.anyio
async def test_batches_never_exceed_batch_size() -> None:
    sink = HeldSink()
    pub = EventPublisher(sink, ApiMetrics(), max_queue=1000, batch_size=4, linger_s=0)
    pub.start()
    for i in range(10):
        pub.publish(event(i))
    sink.release.set()
    await pub.aclose()
    assert [len(b) for b in sink.batches] and max(len(b) for b in sink.batches) <= 4
    assert [e.input_id for b in sink.batches for e in b] == [f"t-{i}" for i in range(10)]
    assert sink.closed


@pytest.mark.anyio
async def test_full_queue_drops_and_counts_without_blocking() -> None:
    metrics = ApiMetrics()
    sink = HeldSink()
    pub = EventPublisher(sink, metrics, max_queue=5, batch_size=2, linger_s=0)
    pub.start()
    assert pub.publish(event(0))
    await asyncio.sleep(0)  # the writer takes event 0 and waits in the held sink
    accepted = [pub.publish(event(i)) for i in range(1, 21)]  # returns at once: never awaits
    assert accepted == [True] * 5 + [False] * 15
    assert outcome_counts(metrics)["dropped_queue_full"] == 15
    sink.release.set()
    await pub.aclose()
    written = [e.input_id for b in sink.batches for e in b]
    assert written == [f"t-{i}" for i in range(6)]
    assert outcome_counts(metrics)["written"] == 6


@pytest.mark.anyio
async def test_sink_failure_drops_that_batch_and_the_writer_goes_on() -> None:
    metrics = ApiMetrics()
    sink = HeldSink(fail_first=1)
    sink.release.set()
    pub = EventPublisher(sink, metrics, max_queue=100, batch_size=3, linger_s=0)
    pub.start()
    for i in range(3):
        pub.publish(event(i))
    await asyncio.sleep(0.01)
    for i in range(3, 5):
        pub.publish(event(i))
    await pub.aclose()
    counts = outcome_counts(metrics)
    assert counts["dropped_sink_error"] == 3
    assert counts["written"] == 2
    assert [e.input_id for b in sink.batches for e in b] == ["t-3", "t-4"]


# Run in a child process under a file-size limit (RLIMIT_FSIZE; Python ignores SIGXFSZ, so a
# write past it is cut short, then fails with EFBIG): a full disk that needs no privileges.
_FULL_DISK_SCRIPT = """
import asyncio, json, resource, sys
from pathlib import Path
from api.observability.events import EventPublisher, JsonlFileSink, encode_jsonl
from api.observability.metrics import ApiMetrics
from tests.api.test_events import event, outcome_counts

path, groups = Path(sys.argv[1]), [20, 20, 20, 5]
starts = [sum(groups[:i]) for i in range(len(groups))]
sizes = [len(encode_jsonl([event(s + i) for i in range(n)])) for s, n in zip(starts, groups)]
# Room for the first two groups and half of the third: the third is cut short; the fourth,
# smaller, fits in what is left once the third is taken back out.
resource.setrlimit(resource.RLIMIT_FSIZE, (sizes[0] + sizes[1] + sizes[2] // 2,) * 2)

async def main():
    metrics = ApiMetrics()
    pub = EventPublisher(JsonlFileSink(path), metrics, max_queue=100, batch_size=20, linger_s=0)
    pub.start()
    for start, n in zip(starts, groups):
        for i in range(n):
            pub.publish(event(start + i))
        await asyncio.sleep(0.05)  # the writer takes this group as one batch
    await pub.aclose()
    print(json.dumps(outcome_counts(metrics)))

asyncio.run(main())
"""


def test_a_batch_cut_short_by_a_full_disk_leaves_no_partial_line_and_the_counters_match(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    out = subprocess.run(
        [sys.executable, "-c", _FULL_DISK_SCRIPT, str(path)], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    counts = json.loads(out.stdout)
    data = path.read_bytes()
    assert data.endswith(b"\n")
    rows = [json.loads(line) for line in data.splitlines()]  # every line is a whole event
    assert [r["input_id"] for r in rows] == [f"t-{i}" for i in [*range(40), *range(60, 65)]]
    assert counts["written"] == len(rows) == 45
    assert counts["dropped_sink_error"] == 20


@pytest.mark.anyio
async def test_a_renamed_or_removed_file_is_replaced_at_its_path(tmp_path: Path) -> None:
    """logrotate's default (rename, then a new file) needs no signal to the API."""
    path = tmp_path / "events.jsonl"
    sink = JsonlFileSink(path)
    await sink.write([event(0)])
    path.rename(tmp_path / "events.jsonl.1")
    await sink.write([event(1)])
    path.unlink()
    await sink.write([event(2)])
    await sink.aclose()
    assert [json.loads(x)["input_id"] for x in (tmp_path / "events.jsonl.1").read_text().splitlines()] == ["t-0"]
    assert [json.loads(x)["input_id"] for x in path.read_text().splitlines()] == ["t-2"]


@pytest.mark.anyio
async def test_http_sink_posts_jsonl_and_retries_5xx_only() -> None:
    bodies: list[bytes] = []
    answers = iter([503, 200, 400])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST"
        assert request.headers["content-type"] == "application/x-ndjson"
        bodies.append(request.content)
        return httpx.Response(next(answers))

    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    sink = HttpSink(client, "http://events.invalid/ingest", attempts=3, retry_budget_s=5)
    await sink.write([event(1), event(2)])
    assert len(bodies) == 2 and bodies[0] == bodies[1]  # 503, then the same batch again
    assert [json.loads(line)["request_id"] for line in bodies[1].splitlines()] == ["req-1", "req-2"]
    with pytest.raises(httpx.HTTPStatusError):  # a 4xx is not retried
        await sink.write([event(3)])
    assert len(bodies) == 3
    await sink.aclose()
    assert client.is_closed


# --- real processes ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def serving(example_serving: Serving) -> str:
    return example_serving.rest_url


def test_api_writes_exactly_one_event_per_scored_request_by_shutdown(
    serving: str, tmp_path: Path
) -> None:
    n = 25
    events_path = tmp_path / "events.jsonl"
    port = free_port()
    # A long linger keeps events queued until SIGTERM, so the drain at shutdown is
    # what writes them.
    api: Process = start_api(
        port,
        serving,
        tmp_path / "api.log",
        EVENTS_JSONL_PATH=str(events_path),
        EVENTS_LINGER_S="30",
    )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: api.alive() and http_ok(f"{base}/readyz"), 60, "the API to be ready")
        sent = {}
        with httpx.Client(base_url=base, timeout=10.0) as client:
            for i, txn in enumerate(generate_transactions(n, seed=7)):
                rid = f"evt-{i}"
                r = client.post("/v1/fraud/score", json=txn.body, headers={"X-Request-ID": rid})
                assert r.status_code == 200, r.text
                sent[rid] = r.json()
            # Invalid requests are not scored and make no event.
            assert client.post("/v1/fraud/score", json={"amount": -1}).status_code == 422
    finally:
        code = api.stop()
    # uvicorn finishes its graceful shutdown, then re-raises the SIGTERM it caught, so a
    # clean stop shows as -SIGTERM here (gunicorn's master exits 0: test_gunicorn.py).
    log = api.log_path.read_text()
    assert code in (0, -signal.SIGTERM), log[-4000:]
    assert "Traceback" not in log, log[-4000:]
    rows = [json.loads(line) for line in events_path.read_text().splitlines()]
    assert len(rows) == n
    assert {r["request_id"] for r in rows} == set(sent)
    for r in rows:
        answer = sent[r["request_id"]]
        assert set(r) == FIELDS
        assert (r["route"], r["input_id"]) == ("fraud", answer["transaction_id"])
        assert r["outputs"] == {"fraud_score": [answer["fraud_score"]]}
        assert r["fields"] == {"is_fraud": answer["is_fraud"]}
        assert (r["model_name"], r["model_version"]) == (
            answer["model"]["name"],
            answer["model"]["version"],
        )
        assert r["latency_ms"] > 0
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["ts"])
