"""The 503s for requests refused for load come from templates (`api.http_server.shed_answers`):
the same bytes the protocol would build field by field, a fresh request id in each.

In process, without a socket (`tests.api.in_process_protocol`), so every byte of an answer
can be compared.
"""

from __future__ import annotations

from collections.abc import Iterator

import orjson
import pytest

from api.http_server.protocol import ApiHttpProtocol
from api.http_server.shed_answers import ShedAnswers
from http_hardening.limits import Refusal
from tests.api.in_process_protocol import RecordingTransport, connection, never_called


@pytest.fixture
def protocol() -> Iterator[tuple[ApiHttpProtocol, RecordingTransport]]:
    with connection(never_called) as made:
        yield made


def _built_field_by_field(conn: ApiHttpProtocol, refusal: Refusal, request_id: str, keep_alive: bool) -> bytes:
    answer = conn._error_answer(refusal, request_id, bytes(conn.url).decode("latin-1"))
    return conn._answer_bytes(refusal, answer, keep_alive=keep_alive)


@pytest.mark.parametrize("refusal", [Refusal.OVERLOADED, Refusal.AT_CAPACITY])
@pytest.mark.parametrize("target", [b"/v1/fraud/score", b"/v2/models/fraud/infer"])
@pytest.mark.parametrize("keep_alive", [True, False])
def test_a_shed_answer_is_the_field_by_field_answer_with_its_own_request_id(
    protocol: tuple[ApiHttpProtocol, RecordingTransport], refusal: Refusal, target: bytes, keep_alive: bool
) -> None:
    conn, _ = protocol
    conn.url = target
    first = conn.shed_answer(refusal, keep_alive=keep_alive)
    second = conn.shed_answer(refusal, keep_alive=keep_alive)
    ids = []
    for answer in (first, second):
        head, body = answer.split(b"\r\n\r\n", 1)
        fields = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
        request_id = fields[b"x-request-id"].decode("ascii")
        assert orjson.loads(body)["request_id"] == request_id
        assert answer == _built_field_by_field(conn, refusal, request_id, keep_alive)
        ids.append(request_id)
    assert ids[0] != ids[1]
    document = orjson.loads(first.split(b"\r\n\r\n", 1)[1])
    assert document["code"] == "overloaded"
    assert ("error" in document) == target.startswith(b"/v2/")


def test_a_new_date_rebuilds_the_template(protocol: tuple[ApiHttpProtocol, RecordingTransport]) -> None:
    conn, _ = protocol
    conn.url = b"/v1/fraud/score"
    assert b"17:00:00 GMT" in conn.shed_answer(Refusal.OVERLOADED, keep_alive=True)
    conn.server_state.default_headers = [(b"date", b"Wed, 02 Dec 2026 17:00:01 GMT"), (b"server", b"uvicorn")]
    assert b"17:00:01 GMT" in conn.shed_answer(Refusal.OVERLOADED, keep_alive=True)


def test_each_shed_answer_is_counted(protocol: tuple[ApiHttpProtocol, RecordingTransport]) -> None:
    conn, _ = protocol
    conn.url = b"/v1/fraud/score"
    counter = conn.registry.metrics.connections_closed.labels("queue_delay")
    before = counter._value.get()
    for _ in range(3):
        conn.shed_answer(Refusal.OVERLOADED, keep_alive=True)
    assert counter._value.get() == before + 3


def test_a_template_needs_the_request_id_in_its_head_and_its_body() -> None:
    answers = ShedAnswers()
    headers: list[tuple[bytes, bytes]] = []
    built = answers.answer("k", headers, lambda rid: f"head {rid}\r\n\r\nbody {rid}".encode(), "a" * 32)
    assert built == b"head " + b"a" * 32 + b"\r\n\r\nbody " + b"a" * 32
    calls = []
    answers.answer("k", headers, lambda rid: calls.append(rid) or b"", "b" * 32)  # type: ignore[func-returns-value]
    assert calls == []  # the template is reused while the headers are the same
    with pytest.raises(ValueError, match="1 times, not twice"):
        answers.answer("other", headers, lambda rid: f"only {rid}".encode(), "c" * 32)


def test_a_head_that_arrives_in_one_read_arms_no_timer_and_one_cut_in_two_does(
    protocol: tuple[ApiHttpProtocol, RecordingTransport], monkeypatch: pytest.MonkeyPatch
) -> None:
    conn, transport = protocol
    monkeypatch.setattr(conn._admission, "admit", lambda sojourn_s, now: False)
    request = b"POST /v1/fraud/score HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"
    conn.data_received(request)
    assert transport.written.startswith(b"HTTP/1.1 503 ")
    assert conn._head_timer is None  # the head and the body came in that one read
    conn.data_received(request[:20])
    assert conn._head_timer is not None  # a head still arriving is bounded
    conn.data_received(request[20:-1])
    assert conn._head_timer is not None  # refused, its body still arriving: bounded too
    conn.data_received(request[-1:])
    assert conn._head_timer is None
    assert transport.written.count(b"HTTP/1.1 503 ") == 2


def test_nothing_is_written_to_a_connection_the_server_has_closed(
    protocol: tuple[ApiHttpProtocol, RecordingTransport],
) -> None:
    # An app still answering a request of a connection the server dropped (a client that
    # did not read): uvloop raises on that write, and each was logged as an error.
    conn, transport = protocol
    transport.close()
    conn._write(b"HTTP/1.1 200 OK\r\n\r\n")
    assert transport.written == b""
