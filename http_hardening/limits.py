"""What a hardened HTTP/1.1 connection allows, why it refused a request, and its answer.

Stdlib only: each tier builds `HttpLimits` from its own settings (the API from gunicorn's
settings and its environment, `api.http_server.ConnectionLimits`; the model server from its
flags, `serving.model_servers.http_limits`) and writes the body of a refusal in its own
error shape (`ErrorAnswer`).
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from http_hardening.admission import AdmissionLimits

__all__ = [
    "LINGER_DECLARED_MAX_BYTES",
    "LINGER_MAX_BYTES",
    "LINGER_S",
    "MAX_PENDING_WRITE_BYTES",
    "MAX_PIPELINED_REQUESTS",
    "WRITE_STALL_S",
    "ErrorAnswer",
    "HttpLimits",
    "Refusal",
]

#: After an answer sent before the request's body was read, how long the rest is read and
#: discarded, seconds, unless the client closes first. A client that sends its whole body
#: before it reads (urllib, http.client) needs this long to finish sending and read the answer
#: instead of a reset: 20 MiB at 50 Mbit/s take 3.4 s. nginx waits 5 s for each read of a
#: lingering close (`lingering_timeout`); Go's net/http 0.5 s once. A lingering connection
#: costs what an idle kept-alive one does (uvicorn's keep-alive timeout is 5 s too), and the
#: API's connection cap closes lingering connections first when it needs room.
LINGER_S: Final = 5.0
#: ... and how many bytes at most are discarded meanwhile, so reading them costs a bounded
#: amount of CPU however fast the client sends.
LINGER_MAX_BYTES: Final = 64 * 1024 * 1024
#: ... unless the request announced a larger body (`Content-Length`): a client that sends its
#: whole body before it reads its answer (urllib, http.client) gets the answer only if the
#: body is read, so up to this much of what it announced is discarded (still within
#: `LINGER_S`). Discarding costs a read per 64-256 KiB: about 40 ms of CPU for 200 MB on
#: loopback. Past it, the connection closes and such a client sees a reset.
LINGER_DECLARED_MAX_BYTES: Final = 256 * 1024 * 1024
#: Bytes of answers a connection may have waiting to be written (the transport's buffer,
#: above what the kernel's socket buffer took) before it is closed: a client that sends
#: requests and never reads its answers otherwise grows the server's memory for good. Four
#: times the largest answer either tier sends in normal use (an upload route's, 256 KiB).
MAX_PENDING_WRITE_BYTES: Final = 1024 * 1024
#: How long a connection's writes may stay paused (the client reads nothing while its
#: answers wait) before it is closed, seconds: a stalled reader holds its request's task and
#: in-flight slot no longer than a kept-alive idle connection is kept (uvicorn's 5 s).
WRITE_STALL_S: Final = 5.0
#: Requests a connection may have parsed and waiting behind the one being answered
#: (HTTP/1.1 pipelining); one more stops the reading: those parsed are answered, then the
#: connection closes. Clients that pipeline send a few.
MAX_PIPELINED_REQUESTS: Final = 16


class Refusal(enum.Enum):
    """Why the connection answered a request itself, before or instead of the app.

    `status` is the HTTP status of the answer.
    """

    TARGET_TOO_LONG = "target_too_long"
    """The request target (URL) is over `HttpLimits.max_target_bytes`: 414."""
    TOO_MANY_HEADER_FIELDS = "too_many_header_fields"
    """More header fields than `HttpLimits.max_header_fields`: 431."""
    HEADER_FIELD_TOO_LARGE = "header_field_too_large"
    """One field (name and value) over `HttpLimits.max_header_field_size`: 431."""
    HEAD_TOO_LARGE = "head_too_large"
    """The request head (request line and fields) over `HttpLimits.max_header_bytes`: 431."""
    HEAD_TIMEOUT = "head_timeout"
    """The head not complete `HttpLimits.header_timeout_s` after its first byte: 408."""
    SHUTDOWN = "shutdown"
    """The body still arriving `HttpLimits.shutdown_body_timeout_s` after the server's
    graceful shutdown began: 503 (the app sees the client disconnect)."""
    MISSING_HOST = "missing_host"
    """An HTTP/1.1 request without a `Host` field, or with more than one: 400 (RFC 9112,
    section 3.2: "A server MUST respond with a 400 (Bad Request)")."""
    OVERLOADED = "overloaded"
    """The request waited longer than admission allows (`HttpLimits.admission`,
    `http_hardening.admission`): 503, before the app sees it."""
    AT_CAPACITY = "at_capacity"
    """The tier has as many requests in its app as it takes (`HardenedHttpProtocol.
    at_capacity`, e.g. the API's in-flight limit): 503, decided from the head, before the
    body is read or the app sees it."""

    @property
    def status(self) -> int:
        """The HTTP status this refusal is answered with."""
        return _STATUS[self]


_STATUS: Final = {
    Refusal.TARGET_TOO_LONG: 414,
    Refusal.TOO_MANY_HEADER_FIELDS: 431,
    Refusal.HEADER_FIELD_TOO_LARGE: 431,
    Refusal.HEAD_TOO_LARGE: 431,
    Refusal.HEAD_TIMEOUT: 408,
    Refusal.SHUTDOWN: 503,
    Refusal.MISSING_HOST: 400,
    Refusal.OVERLOADED: 503,
    Refusal.AT_CAPACITY: 503,
}


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """A refusal's answer in the tier's error shape: the body, its content type and any
    headers of the tier's own (`name`, `value` as bytes, e.g. a request id). The status line,
    the server's default headers, `content-length` and `connection: close` are added by the
    protocol."""

    body: bytes
    headers: Sequence[tuple[bytes, bytes]] = ()
    content_type: bytes = b"application/json"


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """Limits on each client connection (`http_hardening.HardenedHttpProtocol`).

    A connection with no request in progress (it has sent nothing yet, or nothing since its
    last answer) is idle; it closes after uvicorn's keep-alive timeout (`timeout_keep_alive`,
    5 s by default), with no answer: it asked nothing.

    Attributes:
        max_header_bytes: bytes of a request head (request line and every field) at most;
            more is 431. The bytes are counted before they reach httptools, which is fed at
            most this many of a head: its cost grows with the square of a header's size when
            the header arrives over many reads (it joins the pieces by copying).
        max_target_bytes: bytes of the request target (the URL as sent) at most; more is 414.
            None: no limit of its own (`max_header_bytes` still bounds it).
        max_header_fields: header fields per request at most; more is 431. None: no limit.
        max_header_field_size: bytes of one field (name, value and ": ") at most; more is 431.
            None: no limit.
        header_timeout_s: seconds from a request's first byte until its head is complete;
            later is 408 (slow clients, slowloris). None: no limit.
        linger_s: after an answer sent before the request's body was read (the refusals
            here, or the app's, e.g. 413), how long the rest is read and discarded, seconds,
            so the client reads the answer rather than a connection reset (`LINGER_S`).
        linger_max_bytes: ... and how many bytes at most (`LINGER_MAX_BYTES`).
        shutdown_drain_s: at graceful shutdown, how long an idle connection stays open,
            seconds, so a request its client sent just before it could know is answered
            (with `Connection: close`) instead of reset; then it closes (unless a request
            is arriving). 0: closed at once, as uvicorn does.
        shutdown_body_timeout_s: at graceful shutdown, how long a request still receiving
            its body has left to receive it, seconds; then it is answered 503
            (`Refusal.SHUTDOWN`) and closed, so a client trickling a body cannot hold the
            shutdown. None: such a request is waited for.
        linger_declared_max_bytes: after an early answer, how much of a body the request
            announced is discarded at most, bytes (`LINGER_DECLARED_MAX_BYTES`).
        max_pending_write_bytes: answers waiting to be written at most, bytes; more closes
            the connection (`MAX_PENDING_WRITE_BYTES`). While they are over the transport's
            high-water mark, no further pipelined request is started: the connection reads
            no more requests until its writes drain. None: no bound.
        write_stall_s: longest a connection's writes stay paused before it is closed,
            seconds (`WRITE_STALL_S`). None: no bound.
        max_pipelined: requests parsed and waiting behind the one answered at most
            (`MAX_PIPELINED_REQUESTS`); one more stops the reading: those parsed are
            answered, the last with `Connection: close`, then the connection closes.
        require_host: an HTTP/1.1 request must carry exactly one `Host` field, else 400
            (`Refusal.MISSING_HOST`, RFC 9112 section 3.2).
        admission: controlled-delay admission of each request by the time it waited since
            its bytes reached the host (`http_hardening.admission`); a request refused is
            answered 503 (`Refusal.OVERLOADED`) before the app sees it. Every request's
            arrival is passed to the app either way (`ARRIVAL_EXTENSION`). None: no
            admission here.
    """

    max_header_bytes: int
    max_target_bytes: int | None = None
    max_header_fields: int | None = None
    max_header_field_size: int | None = None
    header_timeout_s: float | None = None
    linger_s: float = LINGER_S
    linger_max_bytes: int = LINGER_MAX_BYTES
    shutdown_drain_s: float = 0.0
    shutdown_body_timeout_s: float | None = None
    linger_declared_max_bytes: int = LINGER_DECLARED_MAX_BYTES
    max_pending_write_bytes: int | None = MAX_PENDING_WRITE_BYTES
    write_stall_s: float | None = WRITE_STALL_S
    max_pipelined: int = MAX_PIPELINED_REQUESTS
    require_host: bool = True
    admission: AdmissionLimits | None = None
