"""A request admitted at its head holds its place on the in-flight board from then on
(`api.request.admission.in_flight.Reservation`), not only once its app runs.

Without it, every head read before the first admitted request's task ran was checked against
the same count: at 3x capacity one worker then let thousands more through than its limit,
which its app refused (503) after the work of starting each. In process
(`tests.api.in_process_protocol`), on a loop that is not running, so "before the app ran" is
exact.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from uvicorn.server import ServerState

from api.request.admission.in_flight import RESERVATION_EXTENSION, InFlightBoard, Reservation, reservation_of
from tests.api.in_process_protocol import connection

REQUEST = b"POST /v1/fraud/score HTTP/1.1\r\nHost: t\r\nContent-Length: 2\r\n\r\n{}"


@pytest.fixture
def board() -> Iterator[InFlightBoard]:
    board = InFlightBoard(per_worker=1)
    board.claim()  # this process's app's board (`claimed_board`)
    try:
        yield board
    finally:
        board.release()


async def answers_without_the_middleware(scope: Any, receive: Any, send: Any) -> None:
    """A bare app: it never takes the reservation, so the server gives it back."""
    await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})


def test_a_reservation_is_given_back_once_by_whoever_ends_the_request(board: InFlightBoard) -> None:
    released = Reservation(board)
    assert board.totals()[0] == 1
    released.release()
    released.release()
    assert board.totals()[0] == 0
    assert not released.take()  # given back before the app ran: the app counts it itself
    taken = Reservation(board)
    assert taken.take()
    taken.release()  # the server's release is a no-op once the app took it
    assert board.totals()[0] == 1
    taken.finish()
    assert board.totals()[0] == 0


def test_a_second_head_read_before_the_first_requests_app_ran_sees_its_place(board: InFlightBoard) -> None:
    loop = asyncio.new_event_loop()
    state = ServerState()
    try:
        with connection(answers_without_the_middleware, loop, state) as (first, first_wire):
            first.data_received(REQUEST)
            reservation = reservation_of(first.scope)
            assert isinstance(reservation, Reservation)
            assert first.scope["extensions"][RESERVATION_EXTENSION] is reservation
            assert board.totals()[0] == 1  # counted at the head, its task not run yet
            with connection(answers_without_the_middleware, loop, state) as (second, second_wire):
                second.data_received(REQUEST)
                assert second_wire.written.startswith(b"HTTP/1.1 503 ")  # at the limit of 1
                assert b'"code":"overloaded"' in bytes(second_wire.written)
            loop.run_until_complete(asyncio.sleep(0.01))  # the first's app answers
            assert first_wire.written.startswith(b"HTTP/1.1 200 ")
            assert board.totals()[0] == 0  # the bare app never took it: the server gave it back
    finally:
        loop.close()


def test_a_connection_lost_before_its_app_ran_gives_its_place_back(board: InFlightBoard) -> None:
    loop = asyncio.new_event_loop()
    try:
        with connection(answers_without_the_middleware, loop) as (conn, _):
            conn.data_received(REQUEST)
            assert board.totals()[0] == 1
            conn.connection_lost(None)
            assert board.totals()[0] == 0
            reservation = reservation_of(conn.scope)
            assert reservation is not None and not reservation.take()
        loop.run_until_complete(asyncio.sleep(0.01))  # the task runs, sees the disconnect
    finally:
        loop.close()
