"""One serving replica over TF Serving's REST API (port 8501), through the worker's HTTP/1.1 pools.

The `Http1Client` (`_http1`) is shared by all REST replicas of a worker and owned by
`open_serving_client`; it keeps one connection pool per replica, each sized to the
worker's in-flight limit, whose idle connections expire before serving's own keep-alive
timeout closes them (see `_factory.open_serving_client`). Each call's timeout is what is left
of the request's `Deadline`, capped by `call_timeout_s`, and bounds the whole exchange,
not only each read. Transport exceptions are translated here, in `_TRANSPORT_ERRORS`,
and never leave.
"""

from __future__ import annotations

import asyncio
from typing import Any

import api.serving_client._json as _json
from api.serving_client._deadline import Deadline
from api.serving_client._errors import (
    DEADLINE_PASSED,
    UNREACHABLE,
    ServingBadResponse,
    ServingError,
    ServingRejected,
    ServingTimeout,
    ServingUnavailable,
    call_budget,
    code_for_http_status,
    error_for_code,
)
from api.serving_client._http1 import (
    ConnectError,
    ConnectTimeout,
    Http1Client,
    Http1Error,
    PoolTimeout,
    ReadError,
    RemoteProtocolError,
    ResponseTooLarge,
    ServerDisconnected,
    WriteError,
)
from api.serving_client._types import (
    MetadataProvider,
    ModelMetadata,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    no_metadata,
)

# Transport failure -> (error class, replica_down, what happened). First match wins, so
# subclasses come before their bases. A connect failure marks the replica down (skip it
# for a while); a connection that died under a request does not: it is usually a pooled
# connection serving closed while idle, which `_call` retries once on a fresh one.
_TRANSPORT_ERRORS: tuple[tuple[type[Exception], type[ServingError], bool, str], ...] = (
    (ResponseTooLarge, ServingBadResponse, False, "serving's answer is over the response bound"),
    (ConnectTimeout, ServingUnavailable, True, "connect timed out"),
    (PoolTimeout, ServingTimeout, False, "no free connection to serving in time"),
    (ConnectError, ServingUnavailable, True, UNREACHABLE),
    (ServerDisconnected, ServingUnavailable, False, "connection closed by serving"),
    (ReadError, ServingUnavailable, False, "connection lost while reading"),
    (WriteError, ServingUnavailable, False, "connection lost while writing"),
    (RemoteProtocolError, ServingUnavailable, False, "serving sent invalid HTTP"),
    (Http1Error, ServingUnavailable, False, "transport error"),
)

#: The bound of a model status or metadata answer (a few KB; a large signature's metadata tens
#: of KB), bytes, when the Predict bound is lower.
OTHER_RESPONSE_BYTES = 1024 * 1024

# The body of every REST call we send (TF Serving's JSON API).
_JSON = "application/json"


def translate_transport_error(exc: Exception, target: str) -> ServingError:
    """The `ServingError` for an `_http1` exception (table `_TRANSPORT_ERRORS`)."""
    for transport_cls, cls, replica_down, what in _TRANSPORT_ERRORS:
        if isinstance(exc, transport_cls):
            return cls(f"{what} ({exc})" if isinstance(exc, ResponseTooLarge) else f"{what} ({type(exc).__name__})",
                       replica_down=replica_down, target=target)  # fmt: skip
    raise TypeError(f"not a transport error: {exc!r}")


class RestTransport:
    """TF Serving REST client for one replica (`ServingClient`).

    Args:
        http: the worker's shared `Http1Client`; the replica's pool is taken from it
            once, here.
        base_url: the replica, e.g. "http://serving-1:8501".
        call_timeout_s: upper bound of one call, seconds; the request's deadline
            usually ends it sooner.
        connect_timeout_s: TCP connect timeout, seconds (also capped by the deadline).
        metadata: headers added to every call, read per call (e.g. the request id).
        max_response_bytes: a Predict answer's body at most, bytes (`ClientConfig`); other
            calls' at most `max(max_response_bytes, OTHER_RESPONSE_BYTES)`. Over it: 502
            `serving_bad_response` at once, the connection dropped. None: no bound.
    """

    def __init__(
        self,
        http: Http1Client,
        base_url: str,
        *,
        call_timeout_s: float,
        connect_timeout_s: float,
        metadata: MetadataProvider = no_metadata,
        max_response_bytes: int | None = None,
    ) -> None:
        self.target = base_url.rstrip("/")
        self._max_predict = max_response_bytes
        self._max_other = None if max_response_bytes is None else max(max_response_bytes, OTHER_RESPONSE_BYTES)
        self._pool = http.pool(self.target)
        self._call_timeout_s = call_timeout_s
        self._connect_timeout_s = connect_timeout_s
        self._metadata = metadata

    def __repr__(self) -> str:
        return f"RestTransport({self.target!r})"

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """`POST /v1/models/{name}[/versions/{v} | /labels/{l}]:predict` (columnar JSON).

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        try:
            body = _json.predict_body(request)
        except (TypeError, ValueError) as exc:
            raise ServingRejected(f"an input cannot be written as JSON ({exc})") from exc
        answer = await self._call("POST", _json.predict_path(request), deadline, body, max_bytes=self._max_predict)
        try:
            return _json.predict_response(answer, request)
        except ServingError as exc:
            exc.target = self.target
            raise

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """`GET /v1/models/{name}`: every version's state.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        answer = await self._call("GET", _json.model_path(model_name), deadline)
        try:
            return _json.model_status(answer)
        except ServingError as exc:
            exc.target = self.target
            raise

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """`GET /v1/models/{name}[/versions/{v} | /labels/{l}]/metadata`: the SignatureDefs of
        `version`, else of the version `label` names (a str `version` is a label too), else of
        the latest; the version serving resolved is in the answer's `model_spec`.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        if isinstance(version, str):
            version, label = None, version
        path = _json.model_path(model_name, version, label) + "/metadata"
        answer = await self._call("GET", path, deadline)
        try:
            return _json.model_metadata(answer, version)
        except ServingError as exc:
            exc.target = self.target
            raise

    async def aclose(self) -> None:
        """Nothing to release: the shared `Http1Client` is closed by its owner."""

    async def _call(
        self, method: str, path: str, deadline: Deadline, body: bytes | None = None, *, max_bytes: int | None = None
    ) -> Any:
        """Send one request within the deadline; the parsed JSON body of a 2xx answer."""
        if max_bytes is None:
            max_bytes = self._max_other
        budget = call_budget(deadline, self._call_timeout_s, self.target)
        connect_timeout = min(budget, self._connect_timeout_s)
        headers = self._metadata()
        content_type = _JSON if body is not None else None
        pool = self._pool
        try:
            # The pool bounds waiting for a connection and connecting; asyncio.timeout
            # bounds the whole exchange, so a slow trickle of bytes cannot outlive the
            # deadline (a cancelled exchange closes its connection).
            async with asyncio.timeout(budget):
                try:
                    response = await pool.request(
                        method, path, headers=headers, body=body, content_type=content_type,
                        timeout=budget, connect_timeout=connect_timeout, max_response_bytes=max_bytes,
                    )  # fmt: skip
                except Http1Error as exc:
                    if not exc.stale:
                        raise
                    # A kept-alive connection serving closed just as we reused it: no
                    # answer started, and both calls are idempotent, so send it again
                    # once, on a new connection, within the same deadline.
                    response = await pool.request(
                        method, path, headers=headers, body=body, content_type=content_type,
                        timeout=budget, connect_timeout=connect_timeout, fresh=True, max_response_bytes=max_bytes,
                    )  # fmt: skip
        except TimeoutError:
            raise ServingTimeout(DEADLINE_PASSED, target=self.target) from None
        except Http1Error as exc:
            raise translate_transport_error(exc, self.target) from exc
        status = response.status
        if status < 300:
            try:
                return _json.loads(response.body)
            except ValueError as exc:
                raise ServingBadResponse("serving sent a body that is not JSON", target=self.target) from exc
        message = _json.error_message(response.body, response.reason)
        code = code_for_http_status(status, message)
        raise error_for_code(code, message, status_code=status, target=self.target) from None
