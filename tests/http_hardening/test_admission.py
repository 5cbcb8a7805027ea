"""Admission from the accept queue on (`http_hardening.admission`), and the protocol's new
bounds on the wire: the Host rule, requests shed by their wait, answers nobody reads.

`ControlledDelay` is a pure state machine: table-driven on a made-up clock. The wire tests use
the minimal tier of `tests.http_hardening.test_protocol` on loopback; the server's loop is held
on purpose (a callback that sleeps) to make requests wait as they do behind a busy loop.
"""

from __future__ import annotations

import functools
import socket
import threading
import time
from collections.abc import Iterator

import orjson
import pytest

from http_hardening.admission import AdmissionLimits, ControlledDelay, arrival
from http_hardening.limits import HttpLimits, Refusal
from tests.http_hardening.test_protocol import App, PlainProtocol, Running, serve
from tests.http_hardening.wire import closed_by_peer, connect, get, read_response, serving_in_thread
from tests.support import wait_until

pytestmark = pytest.mark.http_hardening

LIMITS = AdmissionLimits(target_s=0.010, interval_s=0.100)


@pytest.mark.parametrize(
    ("waits", "expected"),
    [
        # (seconds after start, sojourn) -> admitted?
        ([(0.0, 0.001), (0.05, 0.002)], [True, True]),  # fresh requests
        ([(0.0, 0.5), (0.01, 0.5)], [True, True]),  # a burst: above target for under an interval
        ([(0.0, 0.05), (0.05, 0.05), (0.11, 0.05)], [True, True, False]),  # standing for an interval
        ([(0.0, 0.05), (0.11, 0.05), (0.12, 0.005)], [True, False, True]),  # fresh still admitted
        ([(0.0, 0.05), (0.11, 0.05), (0.12, 0.005), (0.13, 0.05)], [True, False, True, True]),  # drained
        ([(0.0, 0.05), (0.2, 0.001), (0.21, 0.05)], [True, True, True]),  # one fresh resets the clock
    ],
)
def test_controlled_delay_refuses_only_in_a_standing_queue(
    waits: list[tuple[float, float]], expected: list[bool]
) -> None:
    codel = ControlledDelay(LIMITS)
    assert [codel.admit(sojourn, 100.0 + at) for at, sojourn in waits] == expected


def test_a_pause_with_no_requests_is_no_standing_queue() -> None:
    codel = ControlledDelay(LIMITS)
    assert codel.admit(0.001, 100.0)
    assert codel.admit(0.3, 105.0)  # the first request after a long quiet spell, though slow
    assert not codel.overloaded(105.05)


def test_arrival_is_when_the_bytes_reached_the_host_not_when_they_were_accepted() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        client = socket.create_connection(listener.getsockname())
        client.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        sent = time.monotonic()
        time.sleep(0.2)  # in the accept queue, unaccepted
        conn, _ = listener.accept()
        with conn, client:
            arrived = arrival(conn)
        assert sent - 0.02 <= arrived <= sent + 0.02, arrived - sent


def test_arrival_without_tcp_info_is_now() -> None:
    left, right = socket.socketpair()
    with left, right:
        assert arrival(left, now=5.0) == 5.0
    assert arrival(None, now=5.0) == 5.0


# --- on the wire ----------------------------------------------------------------------------------


@pytest.fixture
def running(request: pytest.FixtureRequest) -> Iterator[Running]:
    marker = request.node.get_closest_marker("limits")
    yield from serve(HttpLimits(**{"max_header_bytes": 4096, **(marker.kwargs if marker else {})}))


@pytest.fixture
def admitting() -> Iterator[Running]:
    admission = AdmissionLimits(LIMITS.target_s, LIMITS.interval_s, frozenset({"/healthz"}))
    yield from serve(HttpLimits(max_header_bytes=4096, admission=admission))


def hold_loop(running: Running, seconds: float) -> threading.Event:
    """Block the server's loop for `seconds` (from now); the event is set when it starts."""
    assert running.app.loop is not None
    started = threading.Event()

    def block() -> None:
        started.set()
        time.sleep(seconds)

    running.app.loop.call_soon_threadsafe(block)
    assert started.wait(5)
    return started


def answered_within_the_target(running: Running, tries: int = 100) -> None:
    """GET until one is answered, end to end, within the admission target: its wait was
    below it, so no standing-queue clock runs into the test's first stall
    (`ControlledDelay.admit`). A first request that waited longer, on a busy machine,
    started that clock, and the first stall's burst was refused as a standing queue."""
    for _ in range(tries):
        started = time.monotonic()
        assert get(running.port) == 200
        if time.monotonic() - started <= LIMITS.target_s:
            return
    pytest.fail(f"no request answered within {LIMITS.target_s * 1000:g} ms in {tries} tries")


def test_requests_behind_a_standing_queue_are_answered_503_before_the_app_and_probes_are_not(
    admitting: Running,
) -> None:
    answered_within_the_target(admitting)  # the app has started (its loop is known), no clock runs
    # Two stalls in a row, each longer than the interval, with requests queued behind each:
    # the first stall's requests start the standing queue, the second's are refused.
    socks = []
    for _ in range(2):
        hold_loop(admitting, 0.15)
        batch = [connect(admitting.port) for _ in range(3)]
        for i, s in enumerate(batch):
            path = b"/healthz" if (len(socks) + i) == 4 else b"/"
            s.sendall(b"GET " + path + b" HTTP/1.1\r\nHost: t\r\n\r\n")
        socks += batch
        time.sleep(0.16)
    statuses = []
    for s in socks:
        with s:
            status, headers, body = read_response(s)
            statuses.append(status)
            if status == 503:
                assert orjson.loads(body) == {"refused": "overloaded"}
                # Its whole request read (no body): the connection stays open, and its
                # client need not reconnect through the accept queue.
                assert "connection" not in headers
    assert statuses[:3] == [200, 200, 200]  # the first stall: a burst
    assert statuses[4] == 200  # the probe
    assert 503 in statuses[3:], statuses
    assert Refusal.OVERLOADED in admitting.refused
    assert get(admitting.port) == 200  # fresh again: admitted


def test_a_refused_request_with_a_large_body_is_answered_before_its_body_is_sent(admitting: Running) -> None:
    assert get(admitting.port) == 200
    socks = []
    for _ in range(2):  # two stalls: the second's requests meet a standing queue
        hold_loop(admitting, 0.15)
        s = connect(admitting.port)
        s.sendall(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")  # head only
        socks.append(s)
        time.sleep(0.16)
    with socks[0]:
        pass
    with socks[1] as s:
        status, headers, body = read_response(s)  # the body of a million bytes never sent
    assert status == 503 and orjson.loads(body) == {"refused": "overloaded"}
    assert headers["connection"] == "close"


def test_an_http11_request_without_host_is_400_and_one_with_it_is_served(running: Running) -> None:
    for head in (b"GET / HTTP/1.1\r\n\r\n", b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"):
        with connect(running.port) as s:
            s.sendall(head)
            status, _, body = read_response(s)
            assert (status, orjson.loads(body)) == (400, {"refused": "missing_host"})
            assert closed_by_peer(s)
    with connect(running.port) as s:  # HTTP/1.0 has no Host rule
        s.sendall(b"GET / HTTP/1.0\r\n\r\n")
        assert read_response(s)[0] == 200
    assert get(running.port) == 200



@pytest.mark.limits(max_pipelined=4)
def test_past_the_pipelining_limit_the_requests_parsed_are_answered_then_the_connection_closes(
    running: Running,
) -> None:
    with connect(running.port) as s:
        s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n" * 7)  # one being answered, 4 queued, then 2 more
        stream = read_until_closed(s)  # the 6th and 7th are not answered: the client may retry them
    answers = []
    while stream:  # the answers may come in one segment or several
        head, _, rest = stream.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in lines[1:])}
        length = int(headers["content-length"])
        answers.append((int(lines[0].split()[1]), headers.get("connection"), rest[:length]))
        stream = rest[length:]
    assert answers == [(200, None, b"ok")] * 4 + [(200, "close", b"ok")]
    assert get(running.port) == 200  # the others are served


def read_until_closed(s: socket.socket, timeout_s: float = 5.0) -> bytes:
    """Everything the server sends on `s` until it closes the connection (`timeout_s` at most)."""
    s.settimeout(timeout_s)
    data = b""
    while chunk := s.recv(65536):
        data += chunk
    return data


@pytest.mark.limits(max_pending_write_bytes=256 * 1024, write_stall_s=2.0)
def test_a_client_that_never_reads_is_cut_off_at_the_bound_of_its_unread_answers(running: Running) -> None:
    big = b"GET /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n"  # small answers, many
    with connect(running.port) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sent = 0
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                s.sendall(big * 64)
                sent += 64
        except OSError:
            pass  # closed by the server: what the test waits for
        else:
            pytest.fail(f"the server kept reading: {sent} requests pipelined, none read")
    assert get(running.port) == 200  # the others are served


@pytest.mark.limits(write_stall_s=0.5)
def test_pipelined_requests_wait_while_writes_are_paused_and_a_stall_closes_the_connection(running: Running) -> None:
    # Answers of 1 MiB each, none read: the first fills the socket and the transport's buffer
    # (writes pause), so the ones pipelined behind it are not started; the stall then closes it.
    with connect(running.port) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.sendall(b"GET /big HTTP/1.1\r\nHost: t\r\n\r\n" * 8)
        wait_until(lambda: running.app.big >= 1, 5, "the first request answered")
        started = time.monotonic()
        s.settimeout(5)
        # Read nothing: the server closes it once its writes have stalled for 0.5 s.
        with pytest.raises((ConnectionResetError, BrokenPipeError)):
            while time.monotonic() - started < 5:
                s.send(b"")
                time.sleep(0.05)
                s.sendall(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    assert running.app.big < 8, "pipelined requests were started while nothing was read"
    assert get(running.port) == 200


class AtCapacityProtocol(PlainProtocol):
    """The minimal tier, at capacity while `full[0]` is True (as the API is at its in-flight limit)."""

    full: list[bool]

    def at_capacity(self) -> bool:
        return self.full[0]


@pytest.fixture
def at_capacity() -> Iterator[tuple[Running, list[bool]]]:
    app, refused, writes, full = App(), [], [], [True]
    protocol = type("Protocol", (AtCapacityProtocol,), {"refused": refused, "writes": writes, "full": full})
    limits = HttpLimits(max_header_bytes=4096, admission=AdmissionLimits())
    with serving_in_thread(app, functools.partial(protocol, limits=limits)) as (server, port):
        yield Running(server, app, port, refused, writes), full


def test_at_capacity_a_request_is_refused_from_its_head_and_its_connection_kept_when_its_body_is_small(
    at_capacity: tuple[Running, list[bool]],
) -> None:
    running, full = at_capacity
    with connect(running.port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        status, headers, body = read_response(s)
        assert (status, orjson.loads(body)) == (503, {"refused": "at_capacity"})
        assert "connection" not in headers
        assert running.app.reading == 0  # the app never saw it
        full[0] = False
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 5\r\n\r\nhello")
        status, _, body = read_response(s)  # the same connection, the next request
        assert (status, body) == (200, b"5")
    # A body too large to read first: answered at once, unread, and the connection closes.
    full[0] = True
    with connect(running.port) as s:
        s.sendall(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1000000\r\n\r\n")
        status, headers, body = read_response(s)
        assert (status, headers["connection"]) == (503, "close")
    assert running.refused == [Refusal.AT_CAPACITY, Refusal.AT_CAPACITY]
