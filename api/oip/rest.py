"""The OIP REST endpoints (`/v2/...`, the spec's `open_inference_rest.yaml`), in the OpenAPI document.

    app.include_router(oip_router())     # the app's one RequestMiddleware runs around them

Each endpoint only parses the path and body, calls `api.oip.service.OipService` and writes the
answer (`api.oip.rest_codec`). They run inside the API's middleware like every route, so
admission (in flight, time budget, body size: `OIP__MAX_BODY_BYTES` on these paths),
`X-Request-ID`, `Server-Timing`, `X-Model-Version`, the access log and the metrics (route
label: the path template, e.g. `/v2/models/{model_name}/infer`) apply to them unchanged.
Every error answer carries OIP's `{"error": "..."}` beside the API's own fields
(`api.request.errors`), whether the endpoint or the middleware answers it.

The model's version: `versions/{v}` with digits is that version, any other text a version
label; without it, the latest AVAILABLE. Metadata reads SignatureDef `serving_default`, or
the one the `signature_name` query parameter names; infer calls the one its `signature_name`
request parameter names (this front's extension).
"""

from __future__ import annotations

from typing import Any, Final

from fastapi import APIRouter, HTTPException, Query, Request
from starlette.requests import ClientDisconnect
from starlette.responses import Response

from api.observability.metrics import ApiMetrics
from api.oip import rest_codec, schemas
from api.oip.datatypes import TensorDataError
from api.oip.service import OipService
from api.oip.types import OipError
from api.request.admission.rules import OIP_PROBE_PATHS
from api.request.context import current_context
from api.request.errors import OIP_PATH_PREFIX, RETRY_AFTER_S, error_response
from api.serving_client import Code

PREFIX: Final = OIP_PATH_PREFIX  # whose errors carry `error` (api.request.errors)
#: The probes: never refused for load (`Limits.exempt_paths`).
PROBE_PATHS: Final = OIP_PROBE_PATHS
_JSON: Final = "application/json"
_OCTETS: Final = "application/octet-stream"

_ERRORS: dict[int | str, dict[str, Any]] = {
    400: {"model": schemas.ErrorResponse, "description": "The request does not fit the model's signature."},
    404: {"model": schemas.ErrorResponse, "description": "No such model, version or version label."},
    413: {"model": schemas.ErrorResponse, "description": "The body is over OIP__MAX_BODY_BYTES."},
    502: {"model": schemas.ErrorResponse, "description": "Serving failed or answered unusably."},
    503: {"model": schemas.ErrorResponse, "description": "Overloaded, or serving unreachable (Retry-After)."},
    504: {"model": schemas.ErrorResponse, "description": "The request's time budget ran out."},
}


def oip_error_response(exc: OipError, metrics: ApiMetrics) -> Response:
    """`exc` in the API's error shape with OIP's `error` field; a serving failure counted in
    `api_serving_errors_total` by serving's code, as the middleware counts the model routes'."""
    if exc.serving_code is not None:
        metrics.child(metrics.serving_errors, exc.serving_code.name).inc()
    status = exc.http_status
    headers = {"Retry-After": str(RETRY_AFTER_S)} if status == 503 else None
    return error_response(status, exc.code.name.lower(), exc.message, headers)


async def _body(request: Request) -> bytes:
    """The request's body, read whole.

    Raises:
        HTTPException: 400, the client hung up before its body was in: what FastAPI raises when
            a model route's body cannot be read (the same words, answered and logged as 400
            by the same handler), not an unhandled exception (500).
    """
    try:
        return await request.body()
    except ClientDisconnect:
        raise HTTPException(400, "There was an error parsing the body") from None


def _service(request: Request) -> OipService:
    service: OipService = request.app.state.oip_service
    return service


def _json(document: bytes, status: int = 200) -> Response:
    return Response(document, status_code=status, media_type=_JSON)


def oip_router() -> APIRouter:
    """Every OIP REST endpoint (see module doc); the service is the app's `state.oip_service`,
    bound in its lifespan."""
    router = APIRouter(prefix=PREFIX, tags=["Open Inference Protocol (v2)"])

    @router.get("", response_model=schemas.ServerMetadata, summary="Server metadata")
    async def server_metadata(request: Request) -> Response:
        """The server's name, version and the OIP extensions it implements."""
        metadata = _service(request).server_metadata()
        body = {"name": metadata.name, "version": metadata.version, "extensions": list(metadata.extensions)}
        return _json(rest_codec.dumps(body))

    @router.get("/health/live", response_model=schemas.Live, summary="Server live")
    async def server_live(request: Request) -> Response:
        """200 while the process answers; never calls serving."""
        return _json(rest_codec.dumps({"live": _service(request).live()}))

    @router.get(
        "/health/ready",
        response_model=schemas.Ready,
        summary="Server ready",
        responses={503: {"model": schemas.Ready, "description": "A model readiness waits for is not ready."}},
    )
    async def server_ready(request: Request) -> Response:
        """200 when every model the front waits for has a version AVAILABLE, else 503."""
        ready = await _service(request).ready(current_context().deadline)
        return _json(rest_codec.dumps({"ready": ready}), 200 if ready else 503)

    async def model_ready(request: Request, model_name: str, model_version: str | None) -> Response:
        try:
            ready = await _service(request).model_ready(model_name, model_version, current_context().deadline)
        except OipError as exc:
            return oip_error_response(exc, request.app.state.metrics)
        return _json(rest_codec.dumps({"name": model_name, "ready": ready}), 200 if ready else 503)

    async def model_metadata(
        request: Request, model_name: str, model_version: str | None, signature_name: str | None
    ) -> Response:
        try:
            metadata = await _service(request).model_metadata(
                model_name, model_version, current_context().deadline, signature_name or ""
            )
        except OipError as exc:
            return oip_error_response(exc, request.app.state.metrics)
        return _json(rest_codec.encode_metadata(metadata))

    async def infer(request: Request, model_name: str, model_version: str | None) -> Response:
        ctx = current_context()
        metrics: ApiMetrics = request.app.state.metrics
        try:
            with ctx.stage("validate"):
                body = await _body(request)
                length = rest_codec.parse_header_length(request.headers.get(rest_codec.HEADER_LENGTH), len(body))
                parsed = rest_codec.parse_infer_request(body, length, model_name, model_version)
            with ctx.stage("serving"):
                result = await _service(request).infer(parsed, ctx.deadline)
            try:
                content, header_length = rest_codec.encode_infer_result(result, rest_codec.binary_outputs(parsed))
            except TensorDataError as exc:
                raise OipError(Code.INVALID_ARGUMENT, str(exc)) from None
        except OipError as exc:
            return oip_error_response(exc, metrics)
        if header_length is None:
            return _json(content)
        return Response(
            content, media_type=_OCTETS, headers={rest_codec.HEADER_LENGTH: str(header_length)}
        )

    signature_query = Query(
        default=None, description="The SignatureDef whose tensors are described (default serving_default)."
    )

    # Both path forms of each model endpoint, without `versions/{v}` and with it.
    async def ready_latest(request: Request, model_name: str) -> Response:
        return await model_ready(request, model_name, None)

    async def ready_version(request: Request, model_name: str, model_version: str) -> Response:
        return await model_ready(request, model_name, model_version)

    async def metadata_latest(
        request: Request, model_name: str, signature_name: str | None = signature_query
    ) -> Response:
        return await model_metadata(request, model_name, None, signature_name)

    async def metadata_version(
        request: Request, model_name: str, model_version: str, signature_name: str | None = signature_query
    ) -> Response:
        return await model_metadata(request, model_name, model_version, signature_name)

    async def infer_latest(request: Request, model_name: str) -> Response:
        return await infer(request, model_name, None)

    async def infer_version(request: Request, model_name: str, model_version: str) -> Response:
        return await infer(request, model_name, model_version)

    version_doc = " `{model_version}`: digits name a version, other text a version label (models.config)."
    for base, doc, ready_endpoint, metadata_endpoint, infer_endpoint in (
        ("/models/{model_name}", "", ready_latest, metadata_latest, infer_latest),
        ("/models/{model_name}/versions/{model_version}", version_doc, ready_version, metadata_version, infer_version),
    ):
        router.add_api_route(
            base + "/ready",
            ready_endpoint,
            methods=["GET"],
            summary="Model ready",
            description="200 `{name, ready: true}` when the model has the version AVAILABLE, else 503." + doc,
            response_model=schemas.ModelReady,
            responses={404: _ERRORS[404], 503: {"model": schemas.ModelReady, "description": "Not ready."}},
        )
        router.add_api_route(
            base,
            metadata_endpoint,
            methods=["GET"],
            summary="Model metadata",
            description="The AVAILABLE versions and the signature's inputs and outputs (OIP datatype, shape "
            "with -1 for a variable dimension)." + doc,
            response_model=schemas.ModelMetadata,
            responses={k: _ERRORS[k] for k in (400, 404, 502, 503, 504)},
        )
        router.add_api_route(
            base + "/infer",
            infer_endpoint,
            methods=["POST"],
            summary="Inference",
            description="TF Serving's Predict on the model's signature (`signature_name` parameter, default "
            "serving_default). JSON, or JSON then binary tensor data (Inference-Header-Content-Length)." + doc,
            response_model=schemas.InferenceResponse,
            responses=_ERRORS,
            openapi_extra={"requestBody": schemas.INFERENCE_REQUEST_BODY},
        )
    return router
