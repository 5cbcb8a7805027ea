"""Every model route's HTTP endpoint, built from its declaration (`api.model_routes.ModelRoute`).

    endpoint = ModelEndpoint(configured)      # at app build: the route, its OpenAPI entry
    app.include_router(endpoint.router())
    endpoint.bind(served_model, events, cpu_limiter)   # in the lifespan, per worker

A request goes: FastAPI parses and validates the body (`JsonBody`) or the multipart form
(`FileUpload`, the file read up to its limit); stage `validate` ends. Preprocess (on the
loop, or in a worker thread when the route says so) gives one example's inputs, checked
against the declared tensors; stage `features`. The served model
(`api.inference.served_model.ServedModel`: latest AVAILABLE version, the request's deadline)
answers; stage `serving`. Its outputs are checked against the declared ones (502
`serving_bad_response` otherwise), postprocess makes the response, the request and response are
captured when the route samples this one (`api.observability.payload_capture`), and one
`ScoreEvent` is published. With tracing on, preprocess and postprocess are spans of their own (the request's
span and the serving call's are the middleware's and the serving client's,
`api.observability.tracing`).

Errors, all in the API's error shape (`api.request.errors`): 413 for a body or file over the
route's limit, 422 for a request the schema refuses or preprocess calls `InvalidInput`
(at the body, or at the upload's field with the file's name, type and size as `input`),
502/503/504 from serving or the deadline.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, File, UploadFile
from fastapi.exceptions import RequestValidationError
from starlette.datastructures import UploadFile as FormFile

from api.config.enabled_routes import ConfiguredRoute
from api.config.settings import Settings
from api.inference.served_model import ServedModel
from api.inference.tensors import example_inputs, example_outputs
from api.model_routes import FileUpload, InvalidInput, ModelInfo, Prediction, Upload
from api.observability.events import EventPublisher, ScoreEvent
from api.observability.payload_capture import PayloadCapturer
from api.request.context import current_context
from api.request.errors import PayloadTooLarge

if TYPE_CHECKING:
    from api.observability.tracing import Tracing

#: The span of a step when tracing is off: one shared no-op context manager.
_NO_SPAN = contextlib.nullcontext()


def _no_span(name: str) -> contextlib.AbstractContextManager[object]:
    return _NO_SPAN

# Error answers of every model route, in the shape documented in `api.request.errors`.
RESPONSES: dict[int | str, dict[str, Any]] = {
    413: {"description": "The body (or the uploaded file) is over the route's limit (`payload_too_large`)."},
    422: {"description": "The request does not fit the route's schema, or the model cannot use it."},
    502: {"description": "Serving rejected the input or answered unusably (`serving_*`)."},
    503: {"description": "Worker overloaded, or serving unreachable or misconfigured."},
    504: {"description": "The request's time budget ran out (`deadline_exceeded`)."},
}


class ModelEndpoint:
    """One model route's handler: its FastAPI route, and the request path through it.

    Args:
        configured: the route as this deployment serves it.
    """

    def __init__(self, configured: ConfiguredRoute) -> None:
        self.configured = configured
        route = configured.route
        self._route = route
        self._options = configured.options
        self._inputs = configured.signature.inputs
        self._outputs = configured.signature.outputs
        self._output_names = tuple(configured.signature.outputs)
        self._served: ServedModel | None = None
        self._events: EventPublisher[ScoreEvent] | None = None
        self._cpu: anyio.CapacityLimiter | None = None
        self._span: Callable[[str], contextlib.AbstractContextManager[object]] = _no_span
        self._tracing: Tracing | None = None
        self._capture: PayloadCapturer | None = None

    def bind(
        self,
        served: ServedModel,
        events: EventPublisher[ScoreEvent],
        cpu_limiter: anyio.CapacityLimiter,
        *,
        tracing: Tracing | None = None,
        capture: PayloadCapturer | None = None,
    ) -> None:
        """Give the endpoint this worker's served model, event publisher, CPU limiter, tracing and
        payload capture."""
        self._served = served
        self._events = events
        self._cpu = cpu_limiter
        self._span = tracing.span if tracing is not None else _no_span
        self._tracing = tracing
        self._capture = capture

    @property
    def served(self) -> ServedModel:
        """The served model (after `bind`)."""
        assert self._served is not None, "ModelEndpoint used before the lifespan bound it"
        return self._served

    def router(self) -> APIRouter:
        """`POST <path>` with the request schema, response model and errors in OpenAPI."""
        route = self._route
        router = APIRouter(tags=[route.name])
        request = route.request
        if isinstance(request, FileUpload):
            field = request.field

            async def upload_endpoint(**form: UploadFile) -> Any:
                return await self.answer(form[field])

            # FastAPI reads the parameters from __signature__, which typeshed does not declare on functions.
            upload_endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [
                    inspect.Parameter(
                        field,
                        inspect.Parameter.KEYWORD_ONLY,
                        default=File(description=request.description),
                        annotation=UploadFile,
                    )
                ]
            )
            endpoint: Any = upload_endpoint
        else:

            async def json_endpoint(body: Any) -> Any:
                return await self.answer(body)

            # As above: the body's model is the route's, known only here.
            json_endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=request.model)]
            )
            endpoint = json_endpoint
        router.add_api_route(
            route.path,
            endpoint,
            methods=["POST"],
            name=route.name,
            summary=route.summary or None,
            response_model=route.response,
            responses=RESPONSES,
        )
        return router

    async def _read(self, file: FormFile) -> Upload:
        """The uploaded file, read up to its limit; 413 over it, 422 for a type not accepted."""
        declared = self._route.request
        assert isinstance(declared, FileUpload) and self.configured.max_upload_bytes is not None
        limit = self.configured.max_upload_bytes
        data = await file.read(limit + 1)
        if len(data) > limit:
            setting = Settings.model_setting_variable(self._route.name, "max_body_bytes")
            raise PayloadTooLarge(f"{declared.field} is larger than {limit} bytes (raise the limit with {setting})")
        upload = Upload(data, file.filename, file.content_type)
        if declared.media_types and file.content_type not in declared.media_types:
            accepted = ", ".join(declared.media_types)
            raise _invalid_upload(declared, upload, f"a {file.content_type} file; accepted: {accepted}")
        return upload

    async def answer(self, request: Any) -> Any:
        """Preprocess, the served model, postprocess, the score event (see module doc).

        Args:
            request: the validated body, or the `UploadFile` of an upload route.

        Raises:
            RequestValidationError: preprocess raised `InvalidInput` (422).
            PayloadTooLarge: an uploaded file over its limit (413).
            ServingError subclasses, DeadlineExceeded: from serving or the deadline.
        """
        ctx = current_context()
        ctx.stage_since_start("validate")
        route = self._route
        served = self.served
        with ctx.stage("features"), self._span("preprocess"):
            if isinstance(request, FormFile):  # what FastAPI's UploadFile parameter holds
                request = await self._read(request)
            try:
                if route.preprocess_in_thread:
                    # CPU work leaves the loop; the limiter (one slot per usable CPU) bounds
                    # how many run, and so the memory their buffers hold, at once.
                    ctx.deadline.check("preprocessing")
                    values = await anyio.to_thread.run_sync(
                        partial(route.preprocess, request, self._options), limiter=self._cpu
                    )
                else:
                    values = route.preprocess(request, self._options)
            except InvalidInput as exc:
                raise self._invalid(request, str(exc)) from exc
            inputs = example_inputs(self._inputs, values)
        with ctx.stage("serving"):
            predicted = await served.predict(inputs, ctx.deadline, outputs=self._output_names)
        version = predicted.model_version
        assert version is not None, "ServedModel.predict names the version that ran"
        ctx.set_model(served.model_name, version)
        with self._span("postprocess"):
            outputs = example_outputs(self._outputs, predicted.outputs, served.model_name)
            model = ModelInfo(name=served.model_name, version=version)
            response = route.postprocess(request, Prediction(outputs, model), self._options)
        capture = self._capture
        if capture is not None and capture.sampled(self.configured.capture_sample_rate):
            capture.capture(
                request_id=ctx.request_id,
                route=route.name,
                path=route.path,
                request=request,
                response=response,
                redact_paths=route.capture.redact,
                traceparent=self._tracing.traceparent() if self._tracing is not None else None,
                ts=time.time(),
            )
        if self._events is not None:
            self._events.publish(
                ScoreEvent(
                    ts=time.time(),
                    request_id=ctx.request_id,
                    route=route.name,
                    model_name=served.model_name,
                    model_version=version,
                    input_id=route.input_id(request),
                    outputs=outputs,
                    latency_ms=(time.monotonic() - ctx.started) * 1000,
                    fields=dict(route.event_fields(request, response)),
                )
            )
        return response

    def _invalid(self, request: Any, reason: str) -> RequestValidationError:
        if isinstance(request, Upload):
            assert isinstance(self._route.request, FileUpload)
            return _invalid_upload(self._route.request, request, reason)
        return RequestValidationError(
            [{"type": "value_error", "loc": ("body",), "msg": f"Value error, {reason}", "ctx": {"error": reason}}]
        )


def _invalid_upload(declared: FileUpload, upload: Upload, reason: str) -> RequestValidationError:
    """A 422 in FastAPI's validation-error format, located at the upload's form field."""
    return RequestValidationError(
        [
            {
                "type": "value_error",
                "loc": ("body", declared.field),
                "msg": f"Value error, {reason}",
                "input": {"filename": upload.filename, "content_type": upload.content_type, "size": len(upload.data)},
                "ctx": {"error": reason},
            }
        ]
    )
