"""The OIP gRPC calls' SERVER span: the API's tracing (`api.observability.tracing`) as a call hook.

    front.running(app, client, ..., tracing=tracing)   # api.app does this when tracing is on

Each call gets the span the ASGI middleware gives an HTTP request, started from the call's
metadata (W3C `traceparent`/`tracestate`: gRPC metadata keys are HTTP header names, lower case),
current while the rest of the call runs, so the serving client's spans are its children and
serving continues the same trace. Named and attributed per OpenTelemetry's RPC semantic
conventions (`inference.GRPCInferenceService/ModelInfer`; `rpc.system`, `rpc.service`,
`rpc.method`, `rpc.grpc.status_code`, `client.address`), plus the request id and the servable
that answered (`tfserving.request_id`, `tfserving.model_spec.name`, `.version`), as the HTTP
span has. Imported only when tracing is on (it loads OpenTelemetry).
"""

from __future__ import annotations

from typing import Final

from google.protobuf.message import Message
from opentelemetry.trace import Status, StatusCode

from api.observability.tracing import Tracing
from api.oip.hooks import RpcCall, RpcHook, RpcNext, RpcRefused, peer_address
from api.oip.types import OipError
from api.request.context import current_request
from api.serving_client import Code

#: The codes that mark a SERVER span failed: the server's faults, per OpenTelemetry's gRPC
#: conventions (a client's bad argument or a missing model is not the server's error).
SERVER_ERRORS: Final = frozenset(
    {Code.UNKNOWN, Code.DEADLINE_EXCEEDED, Code.UNIMPLEMENTED, Code.INTERNAL, Code.UNAVAILABLE, Code.DATA_LOSS}
)


def server_span_hook(tracing: Tracing) -> RpcHook:
    """A hook (`api.oip.hooks.RpcHook`) that runs each call inside its SERVER span (see module doc).

    Put it first, so a call another hook refuses is traced too. The span ends with the call's
    code: OK, or the code of the `OipError`/`RpcRefused` it raised (re-raised unchanged), or
    UNKNOWN for anything else.
    """

    async def hook(call: RpcCall, proceed: RpcNext) -> Message:
        name = call.method.lstrip("/")
        service, _, method = name.partition("/")
        attributes: dict[str, str] = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": method}
        address = peer_address(call.peer)
        if address is not None:
            attributes["client.address"] = address
        span = tracing.start_server_span(name, call.metadata, attributes)
        token = tracing.activate(span)
        code = Code.UNKNOWN
        try:
            reply = await proceed()
            code = Code.OK
            return reply
        except (OipError, RpcRefused) as exc:
            code = exc.code
            raise
        finally:
            tracing.deactivate(token)
            span.set_attribute("rpc.grpc.status_code", int(code))
            ctx = current_request()
            if ctx is not None:
                span.set_attribute("tfserving.request_id", ctx.request_id)
                if ctx.model_name is not None and ctx.model_version is not None:
                    span.set_attribute("tfserving.model_spec.name", ctx.model_name)
                    span.set_attribute("tfserving.model_spec.version", ctx.model_version)
            if code in SERVER_ERRORS:
                span.set_status(Status(StatusCode.ERROR, code.name))
            span.end()

    return hook
