"""The API's HTTP/1.1 protocol: the shared hardening with the API's limits and error shape.

`ApiHttpProtocol` is `http_hardening.HardenedHttpProtocol` (uvicorn's httptools protocol with
head size and time limits, idle and lingering close and the shutdown drain; its module doc
has the details) with, per connection, what the API adds (`ConnectionLimits` has the
numbers):

- **Open connections.** At most `max_connections` per worker (`connections`): the one
  without a request for the longest is closed to make room, else the new one. Closures the
  server decides are counted in `api_connections_closed_total{reason}`.
- **Refusals** in the API's error shape (`api.request.errors.error_document`: `detail`, `code`,
  `request_id`, and OIP's `error` when the target is under `/v2`) with a fresh request id,
  also in `X-Request-ID`.
- **Graceful shutdown** with a drain window (`shutdown_drain_s`, 1 s): uvicorn closes every
  connection without a request in progress at once, and a request a client sent on a
  kept-alive connection just before or after is reset, unanswered (measured under load:
  requests sent up to ~50 ms after SIGTERM); many clients do not retry a POST.
"""

from __future__ import annotations

from typing import Any, Final

import httptools

from api.http_server.connections import registry_for
from api.http_server.limits import ConnectionLimits
from api.http_server.shed_answers import ShedAnswers
from api.request.admission.in_flight import RESERVATION_EXTENSION, InFlightBoard, Reservation, claimed_board
from api.request.admission.rules import EXEMPT_PATHS, OIP_PROBE_PATHS
from api.request.context import new_request_id
from api.request.errors import RETRY_AFTER_S, error_document, speaks_oip
from http_hardening.limits import ErrorAnswer, Refusal
from http_hardening.protocol import HardenedHttpProtocol

_DEFAULT_LIMITS: Final = ConnectionLimits()

#: Each refusal's (code, reason): `code` in the error body (Starlette's, for an HTTP error:
#: its status phrase), `reason` the label it is counted under in
#: `api_connections_closed_total`. The API sets no shutdown body timeout (a request's
#: deadline bounds its body, `api.request.admission.rules`), so `SHUTDOWN` is never refused; it is listed so
#: that every refusal has its answer.
_CODES: Final = {
    Refusal.TARGET_TOO_LONG: ("uri_too_long", "request_line_too_long"),
    Refusal.TOO_MANY_HEADER_FIELDS: ("request_header_fields_too_large", "header_too_large"),
    Refusal.HEADER_FIELD_TOO_LARGE: ("request_header_fields_too_large", "header_too_large"),
    Refusal.HEAD_TOO_LARGE: ("request_header_fields_too_large", "header_too_large"),
    Refusal.HEAD_TIMEOUT: ("request_timeout", "header_timeout"),
    Refusal.SHUTDOWN: ("service_unavailable", "shutdown"),
    Refusal.MISSING_HOST: ("bad_request", "missing_host"),
    Refusal.OVERLOADED: ("overloaded", "queue_delay"),
    Refusal.AT_CAPACITY: ("overloaded", "in_flight"),
}
_RETRY_AFTER: Final = (b"retry-after", str(RETRY_AFTER_S).encode("ascii"))
# Never refused for load here either: the API's probes and metrics, and OIP's probes (a 404
# when its front is off, which costs as little as any other).
_EXEMPT_PATHS: Final = EXEMPT_PATHS | OIP_PROBE_PATHS
# One per worker process (one server, one event loop), keyed on the server's Date headers.
_SHED_ANSWERS: Final = ShedAnswers()


class ApiHttpProtocol(HardenedHttpProtocol):
    """uvicorn's httptools protocol with the shared hardening, a per-worker connection cap
    and refusals in the API's error shape (module doc).

    Args:
        uvicorn_args: what uvicorn passes (`config`, `server_state`, `app_state`, `_loop`: by
            keyword, as uvicorn's `Server` does, or by position).
        limits: this worker's limits; give them with `functools.partial` (as
            `api.http_server.worker.ApiUvicornWorker` does).
    """

    def __init__(self, *uvicorn_args: Any, limits: ConnectionLimits = _DEFAULT_LIMITS, **uvicorn_kwargs: Any) -> None:
        super().__init__(*uvicorn_args, limits=limits.http_limits(_EXEMPT_PATHS), **uvicorn_kwargs)
        self.limits = limits
        self.registry = registry_for(self.server_state, limits.max_connections)
        self._admitted_on: InFlightBoard | None = None  # the head just admitted counts there
        self._reservation: Reservation | None = None  # the running request's place on it

    def admit_connection(self) -> bool:
        return self.registry.admit(self)

    def connection_idle(self) -> None:
        self.registry.idle(self)  # also while a head arrives: no request yet, still evictable

    def connection_busy(self) -> None:
        self.registry.busy(self)

    def connection_lingering(self) -> None:
        self.registry.lingering(self)

    def connection_gone(self) -> None:
        self.registry.gone(self)

    def request_waited(self, sojourn_s: float, admitted: bool) -> None:
        self.registry.waited(sojourn_s)

    def at_capacity(self) -> bool:
        """The workers are at their limit of requests in flight (`MAX_IN_FLIGHT_REQUESTS`,
        `api.request.admission.in_flight`): refused from the head, before the body is read.
        A counted request under the limit is remembered, for its `Reservation`
        (`on_headers_complete`)."""
        self._admitted_on = None
        board = claimed_board()
        if board is None:
            return False
        counted = httptools.parse_url(self.url).path.decode("latin-1") not in _EXEMPT_PATHS
        if not counted:
            return False
        if board.full():
            return True
        self._admitted_on = board
        return False

    def on_headers_complete(self) -> None:
        """The base's, then the admitted request's place on the in-flight board, taken now
        (`api.request.admission.in_flight.Reservation` says why) when its app starts now,
        not behind an earlier pipelined request."""
        earlier = self.cycle
        super().on_headers_complete()
        board, self._admitted_on = self._admitted_on, None
        cycle = self.cycle
        if board is None or cycle is None or cycle is earlier or self._shedding is not None:
            return
        if self.pipeline and self.pipeline[0][0] is cycle:
            return  # queued: the app counts it when it runs
        self._release_reservation()
        self._reservation = Reservation(board)
        self.scope["extensions"][RESERVATION_EXTENSION] = self._reservation  # type: ignore[assignment]

    def on_response_complete(self) -> None:
        self._release_reservation()
        super().on_response_complete()

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_reservation()
        super().connection_lost(exc)

    def _release_reservation(self) -> None:
        reservation, self._reservation = self._reservation, None
        if reservation is not None:
            reservation.release()

    def connection_dropped(self, reason: str) -> None:
        self.registry.closed(reason)

    def close_connection(self, reason: str) -> None:
        """Close now (the registry needs room); counted under `reason`."""
        self.registry.closed(reason)
        self.close_now()

    def error_answer(self, refusal: Refusal) -> ErrorAnswer:
        """`refusal` in the API's error shape, counted in the registry."""
        self.registry.closed(_CODES[refusal][1])
        # The target as far as it was read (all of it but for a slow head's): its path chooses
        # the shape, as for the app's own errors.
        path = bytes(getattr(self, "url", b"")).decode("latin-1")
        return self._error_answer(refusal, new_request_id(), path)

    def shed_answer(self, refusal: Refusal, *, keep_alive: bool) -> bytes:
        """The 503 to a request refused for load, from a template per `Date` tick
        (`api.http_server.shed_answers`): the same bytes `error_answer` and the protocol
        would write, with a fresh request id; counted in the registry."""
        self.registry.closed(_CODES[refusal][1])
        path = bytes(self.url).decode("latin-1")
        detail = self._detail(refusal) if refusal is Refusal.AT_CAPACITY else None  # it counts requests
        key = (refusal, speaks_oip(path), keep_alive, detail)

        def build(request_id: str) -> bytes:
            answer = self._error_answer(refusal, request_id, path)
            return self._answer_bytes(refusal, answer, keep_alive=keep_alive)

        return _SHED_ANSWERS.answer(key, self.server_state.default_headers, build, new_request_id())

    def _error_answer(self, refusal: Refusal, request_id: str, path: str) -> ErrorAnswer:
        body = error_document(_CODES[refusal][0], self._detail(refusal), request_id, path)
        headers = [(b"x-request-id", request_id.encode("ascii"))]
        if refusal in (Refusal.OVERLOADED, Refusal.AT_CAPACITY):
            headers.append(_RETRY_AFTER)
        return ErrorAnswer(body, headers)

    def _detail(self, refusal: Refusal) -> str:
        limits = self.limits
        if refusal is Refusal.TARGET_TOO_LONG:
            return f"the request target is longer than {limits.max_request_line} bytes"
        if refusal is Refusal.TOO_MANY_HEADER_FIELDS:
            return f"more than {limits.max_header_fields} header fields"
        if refusal is Refusal.HEADER_FIELD_TOO_LARGE:
            return f"a header field is larger than {limits.max_header_field_size} bytes"
        if refusal is Refusal.HEAD_TOO_LARGE:
            return f"the request head is larger than {limits.max_header_bytes} bytes"
        if refusal is Refusal.HEAD_TIMEOUT:
            return f"request head not received within {limits.header_timeout_s:g} s"
        if refusal is Refusal.MISSING_HOST:
            return "an HTTP/1.1 request needs exactly one Host header field (RFC 9112, section 3.2)"
        if refusal is Refusal.OVERLOADED:
            return (
                f"overloaded: requests have waited over {limits.admission_target_s * 1000:g} ms for "
                f"{limits.admission_interval_s * 1000:g} ms; this one waited too long to be served in time"
            )
        if refusal is Refusal.AT_CAPACITY:
            board = claimed_board()
            if board is None:
                return "at the limit of requests in flight"
            return board.refusal_detail()
        return "the server is shutting down"
