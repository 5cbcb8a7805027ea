"""The load generator end to end (`python -m bench.loadgen` through `bench.load`) against a
small HTTP/1.1 server on 127.0.0.1 whose delay and status the test sets; each run is one
second or less. Asserts what was counted, never how fast it went."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench.load import LoadSettings, LoadToolError, run_closed_loop, run_open_loop
from bench.loadgen import http_requests, read_pool
from bench.stats import percentile, summarize_ms
from tests.support import free_port


class TinyServer:
    """HTTP/1.1 keep-alive server in a thread: every POST is answered `status` after `delay_s`
    (the first `slow_first` POSTs after `slow_delay_s`: a start-of-run transient)."""

    def __init__(self, delay_s: float = 0.0, status: int = 200, slow_first: int = 0,
                 slow_delay_s: float = 0.0) -> None:
        self.delay_s, self.status = delay_s, status
        self.slow_first, self.slow_delay_s = slow_first, slow_delay_s
        self.port = free_port()
        self.requests = 0
        self._loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        assert self._ready.wait(10)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length:"))
                await reader.readexactly(length)
                self.requests += 1
                await asyncio.sleep(self.slow_delay_s if self.requests <= self.slow_first else self.delay_s)
                body = b'{"ok":true}'
                writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (self.status, len(body), body))
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._server = self._loop.run_until_complete(
            asyncio.start_server(self._handle, "127.0.0.1", self.port, backlog=512)
        )
        self._ready.set()
        self._loop.run_forever()

    async def _shutdown(self) -> None:
        self._server.close()
        tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    def load(self, pool: Path, timeout_s: float = 2.0) -> LoadSettings:
        return LoadSettings(url=f"http://127.0.0.1:{self.port}/score", pool=pool, timeout_s=timeout_s)


@contextlib.contextmanager
def tiny_server(delay_s: float = 0.0, status: int = 200, slow_first: int = 0,
                slow_delay_s: float = 0.0) -> Iterator[TinyServer]:
    server = TinyServer(delay_s, status, slow_first, slow_delay_s)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def pool(tmp_path: Path) -> Path:
    path = tmp_path / "pool.jsonl"
    path.write_bytes(b'{"transaction_id":"a"}\n{"transaction_id":"bb"}\n\n')
    return path


@pytest.fixture
def server() -> Iterator[TinyServer]:
    with tiny_server() as s:
        yield s


def test_open_loop_sends_the_seeded_timetable_and_counts_every_answer(
    server: TinyServer, pool: Path
) -> None:
    first = run_open_loop(server.load(pool), rate_rps=200, duration_s=1.0, seed=7)
    second = run_open_loop(server.load(pool), rate_rps=200, duration_s=1.0, seed=7)
    assert first.planned == second.planned  # the same Poisson timetable
    assert 120 < first.planned < 280  # Poisson(200): far outside this is not the rate asked for
    assert first.sent == first.ok == first.planned
    assert first.errors.total == 0 and not first.stopped_early and first.unanswered == 0
    assert first.latency is not None and first.latency.count == first.ok
    assert server.requests == first.planned + second.planned
    assert first.achieved_rps == pytest.approx(first.ok / 1.0)
    assert first.generator_lag_p99_ms >= 0 and first.most_connections >= 1


def test_latency_runs_from_the_intended_send_time(pool: Path) -> None:
    with tiny_server(delay_s=0.03) as slow:
        run = run_open_loop(slow.load(pool), rate_rps=100, duration_s=0.5, seed=1)
    assert run.latency is not None and run.latency.p50_ms >= 30.0
    # Concurrent requests each got their own connection: nothing waited behind another.
    assert run.most_connections >= 2


def test_open_loop_reuses_its_keep_alive_connections(pool: Path) -> None:
    from bench import loadgen

    # 50 requests a second, answered at once: each finds the connection the last one freed.
    with tiny_server() as keep_alive:
        url = f"http://127.0.0.1:{keep_alive.port}/score"
        args = ["--open", f"--url={url}", f"--pool={pool}", "--rate=50", "--duration=1", "--timeout=5"]
        result = loadgen.run(loadgen.parser().parse_args(args))
    assert result["ok"] == result["planned"] > 10
    assert result["connections_opened"] <= 4, result["connections_opened"]  # not one per request


def test_non_2xx_answers_are_status_errors(pool: Path) -> None:
    with tiny_server(status=503) as failing:
        run = run_open_loop(failing.load(pool), rate_rps=100, duration_s=0.5, seed=1)
    assert run.ok == 0 and run.errors.status == run.planned > 0
    assert run.latency is None
    # The 503s' own latencies: how fast a shed request was answered.
    assert run.refused_latency is not None and run.refused_latency.count == run.planned


def test_non_2xx_answers_are_counted_by_code_with_the_slowest_answer(pool: Path) -> None:
    from bench import loadgen

    with tiny_server(status=503, delay_s=0.05) as failing:
        url = f"http://127.0.0.1:{failing.port}/score"
        args = ["--open", f"--url={url}", f"--pool={pool}", "--rate=40", "--duration=0.5", "--timeout=5"]
        result = loadgen.run(loadgen.parser().parse_args(args))
    assert result["statuses"] == {"503": result["planned"]} and result["planned"] > 0
    assert 50 <= result["slowest_ms"] < 5000


def test_answers_later_than_the_timeout_are_errors(pool: Path) -> None:
    with tiny_server(delay_s=1.0) as stuck:
        run = run_open_loop(stuck.load(pool, timeout_s=0.3), rate_rps=20, duration_s=0.5, seed=1)
    assert run.errors.timeout == run.planned > 0 and run.ok == 0


def test_a_run_that_cannot_meet_the_slo_stops_early(pool: Path) -> None:
    with tiny_server(delay_s=0.05) as slow:
        run = run_open_loop(slow.load(pool), rate_rps=100, duration_s=5.0, seed=1, slo_ms=25.0,
                            stop_early=True)
    assert run.stopped_early == "more than 1 % of the planned arrivals late"
    assert run.sent < run.planned or run.unanswered > 0
    assert run.sent < 400  # well before the 5 s timetable's ~500 arrivals
    assert run.planned > 400  # the whole timetable, not what was due at the stop
    assert run.late > 0.01 * run.planned  # the evidence it stopped on
    assert run.latency is not None and run.latency.p99_ms > 25.0


def test_late_answers_are_counted_without_stopping(pool: Path) -> None:
    with tiny_server(delay_s=0.05) as slow:
        run = run_open_loop(slow.load(pool), rate_rps=40, duration_s=0.5, seed=1, slo_ms=25.0)
    assert run.stopped_early == ""
    assert run.late == run.ok == run.planned > 0


def test_the_warm_in_is_sent_at_the_rate_and_counted_nowhere(pool: Path) -> None:
    # The first 20 answers are late for the SLO (a start-of-step transient); at 100/s they
    # all arrive within the 0.5 s warm-in, so the measured part has none of them. (The SLO
    # is far above the fast answers': a busy test machine cannot make them late.)
    with tiny_server(slow_first=20, slow_delay_s=0.4) as server:
        cold = run_open_loop(server.load(pool), rate_rps=100, duration_s=1.0, seed=3, slo_ms=250.0)
    with tiny_server(slow_first=20, slow_delay_s=0.4) as server:
        warm = run_open_loop(server.load(pool), rate_rps=100, duration_s=1.0, seed=3, slo_ms=250.0,
                             warm_in_s=0.5)
        requests = server.requests
    assert cold.late >= 20 and cold.warm_in_s == 0.0
    assert warm.late == 0 and warm.errors.total == 0 and warm.warm_in_s == 0.5
    assert warm.sent == warm.ok == warm.planned > 0  # the measured part only
    assert warm.warm_in["sent"] == warm.warm_in["ok"] > 20  # ~50 at 100/s for 0.5 s
    assert requests == warm.warm_in["sent"] + warm.planned
    assert warm.latency is not None and warm.latency.count == warm.ok


def test_a_negative_warm_in_is_refused(pool: Path) -> None:
    from bench import loadgen

    args = ["--open", "--url=http://127.0.0.1:9/score", f"--pool={pool}", "--warm-in=-1"]
    assert loadgen.main(args) == 2


def test_closed_loop_keeps_its_connections_busy(server: TinyServer, pool: Path) -> None:
    run = run_closed_loop(server.load(pool), connections=4, duration_s=0.5)
    assert run.ok > 0 and run.errors.total == 0
    assert run.achieved_rps > 0
    assert run.latency is not None and run.latency.count == run.ok


def test_nothing_listening_is_a_load_tool_error(pool: Path) -> None:
    load = LoadSettings(url=f"http://127.0.0.1:{free_port()}/score", pool=pool)
    with pytest.raises(LoadToolError, match="exited 2"):
        run_open_loop(load, rate_rps=10, duration_s=0.2, seed=1)


def test_requests_are_complete_http_posts(pool: Path) -> None:
    bodies = read_pool(pool)
    assert bodies == [b'{"transaction_id":"a"}', b'{"transaction_id":"bb"}']
    first, second = http_requests("http://127.0.0.1:8000/v1/fraud/score", bodies, "application/json")
    assert first == (b"POST /v1/fraud/score HTTP/1.1\r\nHost: 127.0.0.1:8000\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 22\r\n\r\n"
                     b'{"transaction_id":"a"}')
    assert second.endswith(b"Content-Length: 23\r\n\r\n" + bodies[1])


def test_empty_pool_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty.jsonl"
    empty.write_bytes(b"\n")
    with pytest.raises(ValueError):
        read_pool(empty)


@pytest.mark.parametrize(
    ("values", "p", "expected"),
    [([1.0], 50, 1.0), ([1.0, 2.0], 50, 1.0), ([1.0, 2.0, 3.0, 4.0], 99, 4.0),
     (list(map(float, range(1, 101))), 99, 99.0), (list(map(float, range(1, 1001))), 99.9, 999.0)],
)
def test_nearest_rank_percentile(values: list[float], p: float, expected: float) -> None:
    assert percentile(values, p) == expected


def test_percentile_refuses_no_values_and_bad_ranks() -> None:
    with pytest.raises(ValueError):
        percentile([], 50)
    with pytest.raises(ValueError):
        percentile([1.0], 0)


def test_summary_of_latencies() -> None:
    summary = summarize_ms([float(v) for v in range(1000, 0, -1)])
    assert summary is not None
    assert (summary.count, summary.p50_ms, summary.p99_ms, summary.max_ms) == (1000, 500.0, 990.0, 1000.0)
    assert summarize_ms([]) is None
