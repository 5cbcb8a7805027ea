"""`python -m bench.loadgen`: the benchmark's HTTP/1.1 load generator, open or closed loop.

    python -m bench.loadgen --url http://127.0.0.1:8000/v1/fraud/score --pool bodies.jsonl \
        --open --rate 500 --duration 5 --seed 1 [--warm-in 1] [--slo-ms 25 [--stop-early]]
    python -m bench.loadgen --url ... --pool bodies.jsonl --closed --connections 32 --duration 3
    python -m bench.loadgen --url ... --pool bodies.b64 --content-type application/octet-stream \
        --header 'Inference-Header-Content-Length: 120' --open --rate 100   # base64 lines

Prints one JSON object (see `run`) on stdout. The benchmark runs it as its own process,
pinned to the load generator's CPU (`bench.load` drives it).

**Open loop** (the latency figures; MLPerf's Server scenario): arrivals are a Poisson
process, exponential gaps from a seeded `random.Random`, so every run at a given rate and
seed offers the same timetable, whatever the server does. Each request's latency runs from
its *intended* send time (its arrival) to the last byte of its answer: when the generator
or a free connection was late, that wait counts, as it would for a real client. A request
goes out on an idle keep-alive connection (the most recently used, so idle ones age out
rather than race the server's keep-alive close), or on a new connection opened then (the
connect time counts too), up to `--max-connections`; beyond it requests queue in the
generator, their wait still counted. With `--warm-in`, the timetable starts that many
seconds earlier at the same rate, and those arrivals are sent and answered but counted
nowhere (`warm_in` in the result says how they went): the measured part starts on a
server already at the step's rate, with the connections it needs open (see
`bench.plan.Plan.warm_in_s` for why).

**Closed loop** (warm-up, and the closed-loop RPS beside each curve): `--connections`
connections each send the next request as soon as the previous answer arrives.

Why our own generator instead of wrk + Lua (measured on the 2-core machine this benchmark
targets): wrk's Lua `delay()` has whole-millisecond granularity, so Poisson gaps shorter
than 1 ms (every gap above 1,000 RPS) collapse to 0 and requests bunch; and its
connections are opened once, at start, so an open loop needs a guessed connection count.
This generator waits with `epoll` until 1 ms before the next arrival and polls without
blocking from there, sending within a few tens of microseconds of the timetable, and opens
connections as the load needs them. It costs about 25 us of CPU per request (httptools
parses the answers), so one core offers more than 20,000 requests/s, several times the
fastest setup measured here; every run reports its own send lag and CPU, so a run where
the generator was the limit says so (see `bench.slo.schedule_kept`).
"""

from __future__ import annotations

import argparse
import base64
import errno
import json
import random
import resource
import select
import socket
import sys
import time
from array import array
from collections import deque
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httptools

from bench.slo import LATE_SHARE
from bench.stats import percentile, summarize_ms

#: Idle connections older than this are closed by the generator, before the server's
#: keep-alive (5 s for uvicorn under gunicorn) would close one just as a request goes out.
IDLE_CLOSE_S = 4.0
#: Early stop (`--stop-early`): a run whose failure is certain (a failed request, or more
#: late requests than 1 % of its planned arrivals, `bench.slo.LATE_SHARE`) stops then,
#: but not before this share of its duration.
EARLY_STOP_MIN_SHARE = 0.2
_SPIN_BELOW_S = 0.0011  # epoll's timeout is in whole milliseconds: poll without blocking below
_TIMEOUT_SCAN_S = 0.005

_CONNECTING, _IDLE, _BUSY = 0, 1, 2


class _Conn:
    """One keep-alive connection with at most one request in flight (no pipelining)."""

    __slots__ = (
        "sock", "fd", "state", "parser", "complete", "keep_alive", "arrival", "sent_at", "last_used", "out",
        "pending",
    )

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.fd = sock.fileno()
        self.state = _CONNECTING
        self.parser: httptools.HttpResponseParser | None = None
        self.complete = False
        self.keep_alive = False
        self.arrival = 0.0
        self.sent_at = 0.0
        self.last_used = 0.0
        self.out = b""
        self.pending: tuple[float, bytes] | None = None  # a request waiting for the connect

    def on_message_complete(self) -> None:  # httptools callback
        self.complete = True
        # Read here: once the message is complete the parser has reset for the next one and
        # says False (httptools 0.7), which closed every connection after one answer.
        assert self.parser is not None
        self.keep_alive = self.parser.should_keep_alive()


class Generator:
    """The event loop of one run; see the module docstring. Use `run()`."""

    def __init__(
        self,
        *,
        host: str,
        port: int,
        requests: Sequence[bytes],
        timeout_s: float,
        max_connections: int,
    ) -> None:
        self.address = (host, port)
        self.requests = list(requests)
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.epoll = select.epoll()
        self.conns: dict[int, _Conn] = {}
        self.idle: list[_Conn] = []  # LIFO
        self.next_request = 0
        self.latencies_ms = array("d")
        self.refused_ms = array("d")  # latencies of the 503 answers (shed: how fast a refusal came)
        self.gen_lag_ms = array("d")  # send lag of requests that found a connection at once
        self.ok = 0
        self.errors = {"status": 0, "connect": 0, "read": 0, "timeout": 0}
        self.statuses: dict[str, int] = {}  # the non-2xx answers by status code
        self.slowest_ms = 0.0  # the latest answer of any status within the timeout
        self.sent = 0
        self.late = 0  # answered later than the SLO (early-stop bookkeeping)
        self.slo_s = float("inf")
        self.most_connections = 0
        self.opened = 0  # connections opened during the run (each one passed the accept queue)
        self.spin_s = 0.0
        self._last_scan = 0.0
        # Arrivals before this perf_counter time are the warm-in: sent, never counted.
        self.count_from = 0.0
        self.warm_in = {"sent": 0, "ok": 0, "failed": 0}

    def _counted(self, arrival: float) -> bool:
        """The request that arrived at `arrival` is measured (not part of the warm-in)."""
        return arrival >= self.count_from

    # --- connections ------------------------------------------------------------------

    def _open(self) -> _Conn:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = _Conn(sock)
        code = sock.connect_ex(self.address)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            raise OSError(code, f"connect to {self.address}: {errno.errorcode.get(code, code)}")
        self.conns[conn.fd] = conn
        self.opened += 1
        self.most_connections = max(self.most_connections, len(self.conns))
        self.epoll.register(conn.fd, select.EPOLLOUT | select.EPOLLIN)
        return conn

    def _close(self, conn: _Conn) -> None:
        self.conns.pop(conn.fd, None)
        if conn in self.idle:
            self.idle.remove(conn)
        try:
            self.epoll.unregister(conn.fd)
        except (OSError, ValueError):
            pass
        conn.sock.close()

    def _fail(self, conn: _Conn, kind: str) -> None:
        """The request on `conn` failed: count it, drop the connection."""
        if conn.state == _BUSY or conn.pending is not None:
            arrival = conn.arrival if conn.state == _BUSY else conn.pending[0]  # type: ignore[index]
            self._count_error(arrival, kind)
        self._close(conn)

    def _count_error(self, arrival: float, kind: str) -> None:
        if self._counted(arrival):
            self.errors[kind] += 1
        else:
            self.warm_in["failed"] += 1

    def _send(self, conn: _Conn, arrival: float, request: bytes, now: float) -> None:
        conn.state = _BUSY
        conn.arrival = arrival
        conn.sent_at = now
        conn.complete = False
        conn.parser = httptools.HttpResponseParser(conn)
        self._count_sent(arrival)
        try:
            n = conn.sock.send(request)
        except OSError:
            self._fail(conn, "read")
            return
        if n < len(request):
            conn.out = request[n:]
            self.epoll.modify(conn.fd, select.EPOLLOUT | select.EPOLLIN)

    def _count_sent(self, arrival: float) -> None:
        if self._counted(arrival):
            self.sent += 1
        else:
            self.warm_in["sent"] += 1

    def _next_request(self) -> bytes:
        request = self.requests[self.next_request]
        self.next_request = (self.next_request + 1) % len(self.requests)
        return request

    def dispatch(self, arrival: float, now: float) -> bool:
        """Send the request that arrived at `arrival` on a free or new connection; False when
        every connection is busy and no more may be opened."""
        while self.idle:
            conn = self.idle.pop()
            if now - conn.last_used < IDLE_CLOSE_S:
                self._send(conn, arrival, self._next_request(), now)
                return True
            self._close(conn)
        if len(self.conns) >= self.max_connections:
            return False
        try:
            conn = self._open()
        except OSError:
            self._count_error(arrival, "connect")
            self._count_sent(arrival)
            return True
        conn.pending = (arrival, self._next_request())
        return True

    # --- events ---------------------------------------------------------------------------

    def _on_event(self, fd: int, event: int, now: float) -> _Conn | None:
        """Handle one epoll event; returns the connection when its answer completed."""
        conn = self.conns.get(fd)
        if conn is None:
            return None
        if conn.state == _CONNECTING:
            if not event & (select.EPOLLOUT | select.EPOLLERR | select.EPOLLHUP):
                return None
            if conn.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                assert conn.pending is not None
                arrival = conn.pending[0]
                conn.pending = None
                self._count_error(arrival, "connect")
                self._count_sent(arrival)
                self._close(conn)
                return None
            self.epoll.modify(fd, select.EPOLLIN)
            assert conn.pending is not None
            arrival, request = conn.pending
            conn.pending = None
            self._send(conn, arrival, request, now)
            return None
        if conn.out and event & select.EPOLLOUT:
            try:
                n = conn.sock.send(conn.out)
            except OSError:
                self._fail(conn, "read")
                return None
            conn.out = conn.out[n:]
            if not conn.out:
                self.epoll.modify(fd, select.EPOLLIN)
        if not event & (select.EPOLLIN | select.EPOLLERR | select.EPOLLHUP):
            return None
        try:
            data = conn.sock.recv(65536)
        except BlockingIOError:
            return None
        except OSError:
            data = b""
        if not data:  # closed by the server: an error only with a request in flight
            self._fail(conn, "read")
            return None
        if conn.state != _BUSY or conn.parser is None:
            self._close(conn)  # bytes nobody asked for
            return None
        try:
            conn.parser.feed_data(data)
        except httptools.HttpParserError:
            self._fail(conn, "read")
            return None
        if not conn.complete:
            return None
        status = conn.parser.get_status_code()
        keep_alive = conn.keep_alive
        latency_ms = (now - conn.arrival) * 1e3
        if not self._counted(conn.arrival):
            ok = 200 <= status < 300 and latency_ms <= self.timeout_s * 1e3
            self.warm_in["ok" if ok else "failed"] += 1
            return self._done(conn, now, keep_alive)
        if latency_ms > self.timeout_s * 1e3:
            self.errors["timeout"] += 1
            return self._done(conn, now, keep_alive)
        self.slowest_ms = max(self.slowest_ms, latency_ms)
        if 200 <= status < 300:
            self.ok += 1
            self.latencies_ms.append(latency_ms)
            if latency_ms > self.slo_s * 1e3:
                self.late += 1
        else:
            self.errors["status"] += 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1
            if status == 503:
                self.refused_ms.append(latency_ms)
        return self._done(conn, now, keep_alive)

    def _done(self, conn: _Conn, now: float, keep_alive: bool) -> _Conn | None:
        """`conn` after a complete answer: idle again, or closed when the server closes it."""
        conn.state = _IDLE
        conn.last_used = now
        if keep_alive:
            return conn
        self._close(conn)
        return None

    def poll(self, wait_s: float) -> list[_Conn]:
        """Wait up to `wait_s` for events; the connections whose answers completed."""
        if wait_s >= _SPIN_BELOW_S:
            events = self.epoll.poll(wait_s - 0.001)
        else:
            started = time.perf_counter()
            events = self.epoll.poll(0)
            if not events:
                self.spin_s += time.perf_counter() - started
        now = time.perf_counter()
        done = []
        for fd, event in events:
            conn = self._on_event(fd, event, now)
            if conn is not None:
                done.append(conn)
        if now - self._last_scan >= _TIMEOUT_SCAN_S:
            self._last_scan = now
            for conn in [c for c in self.conns.values() if c.state == _BUSY]:
                if now - conn.arrival > self.timeout_s:
                    self._fail(conn, "timeout")
            # A connect whose SYNs the server's full accept queue dropped is retried by the
            # kernel for minutes (1, 3, 7, 15 s ...): it times out like an unanswered request,
            # or the run would wait for it long after its end.
            for conn in list(self.conns.values()):
                if conn.pending is not None and now - conn.pending[0] > self.timeout_s:
                    self._fail(conn, "timeout")
        return done

    def in_flight(self) -> int:
        """Requests sent (or connecting) and not answered yet."""
        return sum(1 for c in self.conns.values() if c.state == _BUSY or c.pending is not None)

    def late_in_flight(self, now: float) -> int:
        """Requests in flight for longer than the SLO already."""
        return sum(
            1
            for c in self.conns.values()
            if (c.state == _BUSY and self._counted(c.arrival) and now - c.arrival > self.slo_s)
            or (c.pending is not None and self._counted(c.pending[0]) and now - c.pending[0] > self.slo_s)
        )

    def close(self) -> None:
        """Close every connection and the epoll object."""
        for conn in list(self.conns.values()):
            self._close(conn)
        self.epoll.close()

    # --- the two loops ----------------------------------------------------------------------

    def open_loop(
        self, rate_rps: float, duration_s: float, seed: int, slo_ms: float | None,
        stop_early: bool = False, warm_in_s: float = 0.0,
    ) -> dict[str, Any]:
        """Poisson arrivals at `rate_rps` for `warm_in_s` + `duration_s`, the first
        `warm_in_s` seconds not counted; see the module docstring.

        The whole timetable is drawn before the first send, so `planned` (the arrivals
        after the warm-in) is the step's total even when it stops early. With `slo_ms`,
        answers later than it are counted (`late`); with `stop_early` too, the run stops
        once a request failed or more than 1 % of the planned arrivals are late (answered
        late, or in flight or due and older than `slo_ms`).
        """
        rng = random.Random(seed)
        self.slo_s = slo_ms / 1e3 if slo_ms else float("inf")
        for _ in range(min(self.max_connections, 4)):  # a few warm connections to start
            self.idle.append(self._ready_connection())
        offsets = array("d")
        at = rng.expovariate(rate_rps)
        while at < warm_in_s + duration_s:
            offsets.append(at)
            at += rng.expovariate(rate_rps)
        total = len(offsets)
        planned_total = sum(1 for o in offsets if o >= warm_in_s)
        budget = LATE_SHARE * planned_total
        start = time.perf_counter()
        self.count_from = start + warm_in_s
        due = 0  # the next arrival of the timetable
        waiting: deque[float] = deque()
        stopped_early = ""
        last_check = start
        cpu_before = time.process_time()
        while True:
            now = time.perf_counter()
            while due < total and start + offsets[due] <= now:
                waiting.append(start + offsets[due])
                due += 1
            while waiting:
                arrival = waiting[0]
                had_connection = bool(self.idle)
                if not self.dispatch(arrival, now):
                    break
                waiting.popleft()
                if had_connection and self._counted(arrival):
                    self.gen_lag_ms.append((now - arrival) * 1e3)
            if due >= total and not waiting and self.in_flight() == 0:
                break
            # Checked every few ms, not per event: counting late requests walks every connection.
            if (stop_early and slo_ms and now - last_check >= _TIMEOUT_SCAN_S
                    and now - self.count_from >= EARLY_STOP_MIN_SHARE * duration_s):
                last_check = now
                failed = sum(self.errors.values())
                late_waiting = sum(1 for a in waiting if self._counted(a) and now - a > self.slo_s)
                if failed or self.late + self.late_in_flight(now) + late_waiting > budget:
                    stopped_early = "errors" if failed else "more than 1 % of the planned arrivals late"
                    break
            if waiting:
                wait_s = 0.0  # blocked on connections: only answers can help
            elif due < total:
                wait_s = start + offsets[due] - time.perf_counter()
            else:
                wait_s = 0.01  # draining the last answers
            for conn in self.poll(max(0.0, wait_s)):
                self.idle.append(conn)
        elapsed = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_before
        unanswered = len(waiting) + self.in_flight()
        if stopped_early:
            # What was still due or in flight counts as a request at least as late as it
            # was when the run stopped (a lower bound of its latency).
            now = time.perf_counter()
            for c in self.conns.values():
                if c.state == _BUSY and self._counted(c.arrival):
                    self.latencies_ms.append((now - c.arrival) * 1e3)
            self.latencies_ms.extend((now - a) * 1e3 for a in waiting if self._counted(a))
        lag = sorted(self.gen_lag_ms)
        lag_p99 = percentile(lag, 99) if lag else 0.0
        late = sum(1 for v in self.latencies_ms if v > slo_ms) if slo_ms else 0
        return {
            "mode": "open",
            "offered_rps": rate_rps,
            "seed": seed,
            "duration_s": duration_s,
            "warm_in_s": warm_in_s,
            "warm_in": dict(self.warm_in),
            "elapsed_s": elapsed,
            "planned": planned_total,
            "sent": self.sent,
            "ok": self.ok,
            "achieved_rps": self.ok / duration_s,
            "errors": dict(self.errors),
            "statuses": dict(self.statuses),
            "slowest_ms": self.slowest_ms,
            "unanswered": unanswered if stopped_early else 0,
            "late": late,
            "latency": _summary(self.latencies_ms),
            "refused_latency": _summary(self.refused_ms),
            "generator_lag_p99_ms": lag_p99,
            "stopped_early": stopped_early,
            "most_connections": self.most_connections,
            "connections_opened": self.opened,
            "cpu_cores": cpu_s / elapsed if elapsed > 0 else 0.0,
            "busy_cores": max(0.0, cpu_s - self.spin_s) / elapsed if elapsed > 0 else 0.0,
        }

    def _ready_connection(self) -> _Conn:
        """A connected connection (blocking connect: only before a run starts)."""
        sock = socket.create_connection(self.address, timeout=5.0)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        conn = _Conn(sock)
        conn.state = _IDLE
        conn.last_used = time.perf_counter()
        self.conns[conn.fd] = conn
        self.epoll.register(conn.fd, select.EPOLLIN)
        self.most_connections = max(self.most_connections, len(self.conns))
        return conn

    def closed_loop(self, connections: int, duration_s: float) -> dict[str, Any]:
        """`connections` connections, each sending its next request when its answer arrives."""
        conns = [self._ready_connection() for _ in range(connections)]
        start = time.perf_counter()
        end = start + duration_s
        cpu_before = time.process_time()
        for conn in conns:
            self._send(conn, start, self._next_request(), start)
        while True:
            now = time.perf_counter()
            if now >= end and self.in_flight() == 0:
                break
            for conn in self.poll(0.01):
                if now < end:
                    t = time.perf_counter()
                    self._send(conn, t, self._next_request(), t)
            if now < end:
                # Replace connections the server closed or that failed, to keep the loop full.
                while len([c for c in self.conns.values() if c.state != _CONNECTING]) < connections:
                    try:
                        conn = self._ready_connection()
                    except OSError:
                        self.errors["connect"] += 1
                        break
                    t = time.perf_counter()
                    self._send(conn, t, self._next_request(), t)
        elapsed = time.perf_counter() - start
        cpu_s = time.process_time() - cpu_before
        return {
            "mode": "closed",
            "connections": connections,
            "duration_s": duration_s,
            "elapsed_s": elapsed,
            "sent": self.sent,
            "ok": self.ok,
            "achieved_rps": self.ok / elapsed if elapsed > 0 else 0.0,
            "errors": dict(self.errors),
            "latency": _summary(self.latencies_ms),
            "cpu_cores": cpu_s / elapsed if elapsed > 0 else 0.0,
        }


def _summary(latencies_ms: array) -> dict[str, Any] | None:
    summary = summarize_ms(latencies_ms)
    return asdict(summary) if summary else None


def http_requests(
    url: str, bodies: Sequence[bytes], content_type: str, headers: Sequence[str] = ()
) -> list[bytes]:
    """One complete HTTP/1.1 POST per body, ready to send on a keep-alive connection;
    `headers` are extra `Name: value` lines sent with every request."""
    parts = urlsplit(url)
    path = parts.path or "/"
    extra = "".join(f"{h}\r\n" for h in headers)
    head = f"POST {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: {content_type}\r\n{extra}"
    return [head.encode() + b"Content-Length: %d\r\n\r\n" % len(b) + b for b in bodies]


def read_pool(path: Path) -> list[bytes]:
    """Request bodies, one per non-empty line; base64, one per line, in a `.b64` file (for
    bodies with binary data, which may hold a newline).

    Raises:
        ValueError: the file has no body, or a `.b64` line is not base64.
    """
    bodies = [line for line in path.read_bytes().splitlines() if line.strip()]
    if path.suffix == ".b64":
        bodies = [base64.b64decode(line, validate=True) for line in bodies]
    if not bodies:
        raise ValueError(f"no request body in {path}")
    return bodies


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One run as the command line says; the JSON-ready result.

    Open loop: `planned` arrivals (the whole timetable), `sent`, `ok` (2xx), `errors` by kind (status: non-2xx;
    connect; read: connection closed or garbled; timeout: no answer within `--timeout`),
    `latency` (milliseconds from the arrival, 2xx answers only; after an early stop also
    the requests then unanswered, at their age then), `late` (of those, the ones over
    `--slo-ms`), `statuses` (the non-2xx answers by code), `refused_latency` (the 503s'
    latencies, from the arrival too: how fast a shed request learnt it), `slowest_ms` (the latest answer of
    any status), `generator_lag_p99_ms` (how late it
    sent the requests that found a free connection), `connections_opened` (during the run),
    `stopped_early` (why, or ""),
    `cpu_cores` / `busy_cores` (the
    generator's CPU, with and without its non-blocking polls before an arrival).
    Closed loop: `sent`, `ok`, `achieved_rps`, `errors`, `latency` (from the actual send).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    parts = urlsplit(args.url)
    generator = Generator(
        host=parts.hostname or "127.0.0.1",
        port=parts.port or 80,
        requests=http_requests(args.url, read_pool(args.pool), args.content_type, args.header),
        timeout_s=args.timeout,
        max_connections=min(args.max_connections, hard - 16),
    )
    try:
        if args.closed:
            return generator.closed_loop(args.connections, args.duration)
        return generator.open_loop(args.rate, args.duration, args.seed, args.slo_ms, args.stop_early,
                                   warm_in_s=args.warm_in)
    finally:
        generator.close()


def parser() -> argparse.ArgumentParser:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.splitlines()[0])
    mode = p.add_mutually_exclusive_group(required=True)
    mode.add_argument("--open", action="store_true", help="Poisson arrivals at --rate")
    mode.add_argument("--closed", action="store_true", help="--connections back to back")
    p.add_argument("--url", required=True, help="http://host:port/path to POST to")
    p.add_argument("--pool", type=Path, required=True, help="request bodies, one per line")
    p.add_argument("--content-type", default="application/json")
    p.add_argument("--header", action="append", default=[], help="'Name: value' sent with every request")
    p.add_argument("--rate", type=float, default=100.0, help="open loop: arrivals per second")
    p.add_argument("--seed", type=int, default=1, help="open loop: the arrival process's seed")
    p.add_argument("--duration", type=float, default=5.0, help="seconds of arrivals / sending")
    p.add_argument(
        "--warm-in", type=float, default=0.0,
        help="open loop: seconds of arrivals at --rate before --duration, sent but not counted",
    )
    p.add_argument("--connections", type=int, default=32, help="closed loop: connections")
    p.add_argument("--max-connections", type=int, default=512, help="open loop: at most")
    p.add_argument("--timeout", type=float, default=2.0, help="an answer later is an error")
    p.add_argument("--slo-ms", type=float, help="open loop: count answers later than this (late)")
    p.add_argument(
        "--stop-early", action="store_true",
        help="open loop, with --slo-ms: stop once a request failed or over 1 %% of the planned are late",
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """Run, print the JSON result; 2 on a bad command line or an unreachable server."""
    args = parser().parse_args(argv)
    if args.open and not args.rate > 0:
        print("python -m bench.loadgen: --rate must be > 0", file=sys.stderr)
        return 2
    if args.warm_in < 0:
        print("python -m bench.loadgen: --warm-in must be >= 0", file=sys.stderr)
        return 2
    try:
        result = run(args)
    except OSError as exc:
        print(f"python -m bench.loadgen: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
