"""Every model route's HTTP endpoint, built from its declaration (`api.model_routes.ModelRoute`).

    endpoint = ModelEndpoint(configured)      # at app build: the route, its OpenAPI entry
    app.include_router(endpoint.router())
    endpoint.bind(rollout, events, cpu_limiter)   # in the lifespan, per worker

A request goes: FastAPI parses and validates the body (`JsonBody`) or the multipart form
(`FileUpload`, the file read up to its limit), and the optional `X-Model-Version` /
`X-Model-Label` headers; stage `validate` ends. Preprocess (on the loop, or in a worker thread
when the route says so) gives one example's inputs, checked against the declared tensors;
stage `features`. The route's rollout (`api.rollouts.RouteRollout`) assigns the request an arm
(stable, canary, or pinned by those headers) and its target's served model answers within the
request's deadline; stage `serving`. Its outputs are checked against the declared ones (502
`serving_bad_response` otherwise), postprocess makes the response, the request and response are
captured when the route samples this one (`api.observability.payload_capture`), the rollout may
mirror the request to its shadow (in the background, never awaited), and one `ScoreEvent` is
published. With tracing on, preprocess and postprocess are spans of their own (the request's
span and the serving call's are the middleware's and the serving client's,
`api.observability.tracing`).

Errors, all in the API's error shape (`api.request.errors`): 403 for a pinned version the
rollout does not allow, 404 for a pinned version serving does not have, 413 for a body or file
over the route's limit, 422 for a request the schema refuses or preprocess calls `InvalidInput`
(at the body, or at the upload's field with the file's name, type and size as `input`), or for
a malformed or doubled pin header, 502/503/504 from serving or the deadline.
"""

from __future__ import annotations

import contextlib
import inspect
import time
from collections.abc import Callable, Mapping
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, Annotated, Any

import anyio
import anyio.to_thread
from fastapi import APIRouter, File, Header, UploadFile
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel
from starlette.datastructures import UploadFile as FormFile

from api.config.enabled_routes import ConfiguredRoute
from api.config.rollouts import NAME_PATTERN
from api.config.settings import Settings
from api.inference.tensors import example_inputs, example_outputs
from api.model_routes import FileUpload, InvalidInput, ModelInfo, Prediction, Upload
from api.observability.events import EventPublisher, ScoreEvent
from api.observability.payload_capture import PayloadCapturer
from api.request.context import current_context
from api.request.errors import PayloadTooLarge
from api.rollouts import RouteRollout
from api.serving_client import Tensor

if TYPE_CHECKING:
    from api.observability.tracing import Tracing

#: The span of a step when tracing is off: one shared no-op context manager.
_NO_SPAN = contextlib.nullcontext()


def _no_span(name: str) -> contextlib.AbstractContextManager[object]:
    return _NO_SPAN

# Error answers of every model route, in the shape documented in `api.request.errors`.
RESPONSES: dict[int | str, dict[str, Any]] = {
    403: {"description": "X-Model-Version / X-Model-Label sent, but the route's rollout does not allow pinning."},
    404: {"description": "The pinned version (or label) is not AVAILABLE on serving."},
    413: {"description": "The body (or the uploaded file) is over the route's limit (`payload_too_large`)."},
    422: {"description": "The request does not fit the route's schema, or the model cannot use it."},
    502: {"description": "Serving rejected the input or answered unusably (`serving_*`)."},
    503: {"description": "Worker overloaded, or serving unreachable or misconfigured."},
    504: {"description": "The request's time budget ran out (`deadline_exceeded`)."},
}


# The pin headers (`api.rollouts`): TF Serving's `model_spec.version` (int64) or
# `model_spec.version_label`; FastAPI answers a malformed one 422 like any other parameter.
PinVersion = Annotated[
    int | None,
    Header(
        alias="X-Model-Version",
        ge=0,
        le=2**63 - 1,
        description="Pin this model version, when the route's rollout allows pinning (else 403).",
    ),
]
PinLabel = Annotated[
    str | None,
    Header(
        alias="X-Model-Label",
        pattern=f"^{NAME_PATTERN.pattern}$",
        description="Pin the version serving's config labels so (models.config version_labels), when "
        "the route's rollout allows pinning (else 403).",
    ),
]
_PIN_PARAMETERS = [
    inspect.Parameter("x_model_version", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=PinVersion),
    inspect.Parameter("x_model_label", inspect.Parameter.KEYWORD_ONLY, default=None, annotation=PinLabel),
]


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
        self._rollout: RouteRollout | None = None
        self._events: EventPublisher[ScoreEvent] | None = None
        self._cpu: anyio.CapacityLimiter | None = None
        self._span: Callable[[str], contextlib.AbstractContextManager[object]] = _no_span
        self._tracing: Tracing | None = None
        self._capture: PayloadCapturer | None = None

    def bind(
        self,
        rollout: RouteRollout,
        events: EventPublisher[ScoreEvent],
        cpu_limiter: anyio.CapacityLimiter,
        *,
        tracing: Tracing | None = None,
        capture: PayloadCapturer | None = None,
    ) -> None:
        """Give the endpoint this worker's rollout of the route, event publisher, CPU limiter,
        tracing and payload capture."""
        self._rollout = rollout
        self._events = events
        self._cpu = cpu_limiter
        self._span = tracing.span if tracing is not None else _no_span
        self._tracing = tracing
        self._capture = capture

    @property
    def rollout(self) -> RouteRollout:
        """The route's rollout in this worker (after `bind`)."""
        assert self._rollout is not None, "ModelEndpoint used before the lifespan bound it"
        return self._rollout

    def router(self) -> APIRouter:
        """`POST <path>` with the request schema, response model and errors in OpenAPI."""
        route = self._route
        router = APIRouter(tags=[route.name])
        request = route.request
        if isinstance(request, FileUpload):
            field = request.field

            async def upload_endpoint(
                *, x_model_version: int | None = None, x_model_label: str | None = None, **form: UploadFile
            ) -> Any:
                return await self.answer(form[field], pin_version=x_model_version, pin_label=x_model_label)

            # FastAPI reads the parameters from __signature__, which typeshed does not declare on functions.
            upload_endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [
                    inspect.Parameter(
                        field,
                        inspect.Parameter.KEYWORD_ONLY,
                        default=File(description=request.description),
                        annotation=UploadFile,
                    ),
                    *_PIN_PARAMETERS,
                ]
            )
            endpoint: Any = upload_endpoint
        else:

            async def json_endpoint(
                body: Any, *, x_model_version: int | None = None, x_model_label: str | None = None
            ) -> Any:
                return await self.answer(body, pin_version=x_model_version, pin_label=x_model_label)

            # As above: the body's model is the route's, known only here.
            json_endpoint.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
                [
                    inspect.Parameter("body", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=request.model),
                    *_PIN_PARAMETERS,
                ]
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

    async def answer(self, request: Any, *, pin_version: int | None = None, pin_label: str | None = None) -> Any:
        """Preprocess, the rollout's target, postprocess, the shadow, the score event (see module doc).

        Args:
            request: the validated body, or the `UploadFile` of an upload route.
            pin_version / pin_label: the client's `X-Model-Version` / `X-Model-Label`.

        Raises:
            RequestValidationError: preprocess raised `InvalidInput`, or both pins are given (422).
            PayloadTooLarge: an uploaded file over its limit (413).
            PinningRefused, PinnedVersionNotFound: a pin the rollout refuses (403) or serving lacks (404).
            ServingError subclasses, DeadlineExceeded: from serving or the deadline.
        """
        ctx = current_context()
        ctx.stage_since_start("validate")
        route = self._route
        rollout = self.rollout
        if pin_version is not None and pin_label is not None:
            # TF Serving's own rule (http_rest_api_util.cc FillModelSpecWithNameVersionAndLabel).
            raise RequestValidationError(
                [
                    {
                        "type": "value_error",
                        "loc": ("header", "X-Model-Label"),
                        "msg": "Value error, X-Model-Version and X-Model-Label cannot both be supplied",
                        "input": pin_label,
                        "ctx": {"error": "both a version and a version label"},
                    }
                ]
            )
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
        assignment = rollout.assign(
            route.rollout_key(request) or ctx.request_id, pin_version=pin_version, pin_label=pin_label
        )
        ctx.set_arm(assignment.arm, assignment.model_name)
        with ctx.stage("serving"):
            predicted = await rollout.predict(assignment, inputs, ctx.deadline, self._output_names)
        version = predicted.model_version
        assert version is not None, "ServedModel.predict names the version that ran"
        model_name = assignment.model_name
        ctx.set_model(model_name, version)
        with self._span("postprocess"):
            outputs = example_outputs(self._outputs, predicted.outputs, model_name)
            model = ModelInfo(name=model_name, version=version)
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
        input_id = route.input_id(request)
        rollout.mirror(
            assignment,
            inputs=inputs,
            outputs=self._output_names,
            deadline=ctx.deadline,
            # An upload's bytes are not held while the shadow waits (its features are in
            # `inputs`): the shadow's postprocess gets the upload without them.
            answer=partial(self._shadow_answer, replace(request, data=b"") if isinstance(request, Upload) else request),
            primary=response,
            primary_version=version,
            request_id=ctx.request_id,
            input_id=input_id,
        )
        if self._events is not None:
            self._events.publish(
                ScoreEvent(
                    ts=time.time(),
                    request_id=ctx.request_id,
                    route=route.name,
                    model_name=model_name,
                    model_version=version,
                    input_id=input_id,
                    outputs=outputs,
                    latency_ms=(time.monotonic() - ctx.started) * 1000,
                    fields=dict(route.event_fields(request, response)),
                    arm=assignment.arm,
                )
            )
        return response

    def _shadow_answer(
        self, request: Any, predicted: Mapping[str, Tensor], model_name: str, version: int
    ) -> tuple[dict[str, Any], BaseModel]:
        """The route's answer had the shadow answered: its outputs checked as the primary's, then
        postprocess (`api.rollouts.shadow`; whatever this raises is counted as a failed shadow)."""
        outputs = example_outputs(self._outputs, predicted, model_name)
        prediction = Prediction(outputs, ModelInfo(name=model_name, version=version))
        return outputs, self._route.postprocess(request, prediction, self._options)

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
