"""The REST API handler: TF Serving's ``http_rest_api_handler.cc`` (``g3doc/api_rest.md``).

Routes (``model_servers/http_rest_api_util.cc``; case-insensitive, names and labels URL-decoded)::

    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]            -> model status
    GET  /v1/models/{name}[/versions/{v} | /labels/{l}]/metadata   -> model metadata
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:predict    -> predict
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:classify   -> see below
    POST /v1/models/{name}[/versions/{v} | /labels/{l}]:regress    -> see below

Like TF Serving's ``HttpRestApiHandler``, this module only parses the path, decodes, calls the core
(:class:`~serving.servables.tensorflow.predict_impl.Predictor`,
:mod:`serving.servables.tensorflow.get_model_metadata_impl`) and encodes -- there is no inference
logic here. It matches TF Serving's own two regular expressions instead of declaring Starlette
routes, so that routing corner cases behave the same: any other ``/v1/...`` path or method is
``400 {"error": "Malformed request: <METHOD> <path>"}``. Paths outside ``/v1/`` are ignored by TF
Serving's dispatcher (a bare 404); here they are ``404`` with the same ``Malformed request``
message.

Errors are raised as :class:`~serving.util.errors.ServingError`; :mod:`serving.model_servers.http_server`
answers them in one place. Every response is ``application/json``. ``:classify`` / ``:regress`` take tf.Examples as JSON
(:mod:`serving.util.json_example`, where the traps are listed -- notably the ``"results"`` key) and run
on
:class:`~serving.servables.tensorflow.inference_runner.InferenceRunner`; like TF Serving, the body is parsed before
the model is looked up, so a malformed body is a 400 even for an unknown model.

Large bodies (:data:`CODEC_OFFLOAD_BODY_BYTES`, 64 KiB, and more) are parsed and decoded, and
large answers (:data:`CODEC_OFFLOAD_OUTPUT_ELEMENTS`, 4,096 output elements, and more) encoded, on
the handler's *codec executor*: the server's low-priority worker processes
(:class:`~serving.util.process_executor.ProcessExecutor`, ``--rest_api_num_json_processes``), so
that one client's large bodies hold neither the event loop nor the GIL the others need; or the
request threads when those are off. Smaller ones are handled here: the hop costs more than they
do (a 64 KiB body takes ~0.25 ms to parse and decode, as much as a round trip to a worker). A
large predict body is decoded in one pass (:func:`~serving.util.json_tensor.decode_predict_body`)
for the input dtypes of every signature of the servable the path names, looked up before the
body is sent; its errors are still reported in TF Serving's order (parse, lookup, signature,
decode), and a body decoded for a version that was swapped meanwhile is decoded again here.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, Protocol, TypeVar
from urllib.parse import unquote

import numpy as np
import orjson
from starlette.requests import Request
from starlette.responses import Response

from serving.apis import ExampleRequest, ModelSpec
from serving.core.manager import ServableManager
from serving.model_servers.get_model_status_impl import get_model_status, model_status_json
from serving.servables.tensorflow import get_model_metadata_impl as metadata
from serving.servables.tensorflow.inference_runner import InferenceService
from serving.servables.tensorflow.predict_impl import PredictService
from serving.util import json_example, json_tensor
from serving.util.errors import Code, ServingError
from serving.util.request_limits import RequestLimits

__all__ = [
    "CODEC_OFFLOAD_BODY_BYTES",
    "CODEC_OFFLOAD_OUTPUT_ELEMENTS",
    "CORS_HEADERS",
    "CodecExecutor",
    "HttpRestApiHandler",
    "error_json",
    "json_response",
]

_T = TypeVar("_T")

# kHTTPRestApiHandlerPathRegex, kPredictionApiGegex, kModelStatusApiRegex (RE2 FullMatch).
_REST_API_PATH = re.compile(r"/v1/.*", re.IGNORECASE | re.DOTALL)
_PREDICTION_API = re.compile(
    r"/v1/models/([^/:]+)(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?:(classify|regress|predict)",
    re.IGNORECASE,
)
_MODEL_STATUS_API = re.compile(
    r"/v1/models(?:/([^/:]+))?(?:(?:/versions/(\d+))|(?:/labels/([^/:]+)))?(?:/(metadata))?",
    re.IGNORECASE,
)
_INT64_MAX = 2**63 - 1
#: Bodies this large are parsed and decoded on the codec executor (see the module doc).
CODEC_OFFLOAD_BODY_BYTES = 64 * 1024
#: Answers with this many output elements are encoded on it (~20-45 ns each: 0.3-0.7 ms).
CODEC_OFFLOAD_OUTPUT_ELEMENTS = 4 * 1024
_JSON = "application/json"
CORS_HEADERS: Mapping[str, str] = {
    "Access-Control-Allow-Origin": "*",
    "Access-Control-Allow-Methods": "POST, GET",
    "Access-Control-Allow-Headers": "Content-Type",
}


def json_response(body: bytes, status: int, headers: Mapping[str, str]) -> Response:
    """An ``application/json`` response with ``body`` (bytes), HTTP ``status`` and ``headers``."""
    return Response(body, status_code=status, media_type=_JSON, headers=dict(headers))


def error_json(message: str) -> bytes:
    """TF Serving's error body, ``{"error": "<message>"}`` (``MakeJsonFromStatus``); messages may
    carry undecodable request bytes (lone surrogates), written as U+FFFD."""
    try:
        return orjson.dumps({"error": message})
    except orjson.JSONEncodeError:
        return orjson.dumps({"error": message.encode("utf-8", "replace").decode("utf-8")})


class CodecExecutor(Protocol):
    """Where large bodies are decoded and large answers encoded: a
    :class:`~serving.util.process_executor.ProcessExecutor` or a
    :class:`~serving.util.executor.BlockingExecutor`."""

    async def run(self, fn: Callable[..., _T], /, *args: Any) -> _T:
        """``fn(*args)`` off the event loop; raises what it raises."""
        ...


class HttpRestApiHandler:
    """``HttpRestApiHandler::ProcessRequest``: path -> core call -> JSON."""

    def __init__(
        self,
        predictor: PredictService,
        inference: InferenceService,
        manager: ServableManager,
        timeout_ms: int | None,
        enable_cors: bool,
        limits: RequestLimits | None = None,
        codec_executor: CodecExecutor | None = None,
    ) -> None:
        """``limits`` bound each request's decoded elements (``--max_request_elements``); its
        body's size and time are held where it is read (:mod:`serving.model_servers.http_limits`).
        ``codec_executor`` decodes large bodies and encodes large answers (none: all on the
        event loop)."""
        self._codec = codec_executor
        self._limits = limits if limits is not None else RequestLimits()
        self._predictor = predictor
        self._inference = inference
        self._manager = manager
        self._timeout_ms = timeout_ms if timeout_ms and timeout_ms > 0 else None
        self._headers: Mapping[str, str] = dict(CORS_HEADERS) if enable_cors else {}
        self._cors = enable_cors

    async def handle(self, request: Request) -> Response:
        """Answer one request (any method, any path); raises :class:`ServingError` for errors."""
        method = request.method
        raw_path = request.scope.get("raw_path")
        # The undecoded path (ASGI raw_path has no query string; some clients add it anyway).
        path = raw_path.partition(b"?")[0].decode("latin-1") if raw_path else request.url.path
        if not _REST_API_PATH.fullmatch(path):
            raise ServingError(Code.NOT_FOUND, f"Malformed request: {method} {path}")
        if method == "OPTIONS" and self._cors:
            return Response(b"", status_code=200, headers=dict(self._headers))
        if method == "POST" and (match := _PREDICTION_API.fullmatch(path)):
            model = _model_info(match.group(1), match.group(2), match.group(3))
            verb = match.group(4)
            if verb == "predict":
                return await self._predict(model, await request.body())
            if verb == "classify":
                return await self._classify(model, await request.body())
            if verb == "regress":
                return await self._regress(model, await request.body())
        elif method == "GET" and (match := _MODEL_STATUS_API.fullmatch(path)):
            spec = _model_info(match.group(1) or "", match.group(2), match.group(3)).spec()
            if not spec.name:
                raise ServingError(Code.INVALID_ARGUMENT, "Missing model name in request.")
            if match.group(4) == "metadata":
                response = metadata.get_model_metadata(self._manager, spec)
                return self._ok(metadata.model_metadata_json(response))
            status = get_model_status(self._manager, spec)
            return self._ok(model_status_json(status))
        raise ServingError(Code.INVALID_ARGUMENT, f"Malformed request: {method} {path}")

    def _ok(self, body: bytes) -> Response:
        return json_response(body, 200, self._headers)

    async def _predict(self, model: _ModelInfo, body: bytes) -> Response:
        """``ProcessPredictRequest``: parse, GetInfoMap, decode, predict, encode.

        The JSON is parsed before the servable is looked up (a malformed body is a 400 even for
        an unknown model); GetInfoMap, decoding and the prediction share one lookup.
        """
        doc: dict[str, Any] | None = None
        decoded: json_tensor.PredictBody | None = None
        if self._codec is None or len(body) < CODEC_OFFLOAD_BODY_BYTES:
            doc = json_tensor.parse_json(body)
            signature = json_tensor.signature_name(doc)
        else:
            decoded = await self._codec.run(
                json_tensor.decode_predict_body, body, self._input_dtypes_by_signature(model)
            )
            signature = decoded.signature_name

        def decode(
            input_dtypes: dict[str, str],
        ) -> tuple[json_tensor.JsonFormat, dict[str, np.ndarray]]:
            if decoded is not None and decoded.input_dtypes == input_dtypes:
                fmt, inputs = decoded.tensors()
            else:  # a small body; or a large one whose version was swapped since (rare)
                parsed = doc if doc is not None else json_tensor.parse_json(body)
                fmt, inputs = json_tensor.decode_predict_inputs(parsed, input_dtypes, signature)
            self._limits.check_elements(sum(array.size for array in inputs.values()))
            return fmt, inputs

        fmt, response = await self._predictor.decode_and_predict(
            model.spec(signature), decode, timeout_ms=self._timeout_ms
        )
        return self._ok(await self._encode_predict_outputs(dict(response.outputs), fmt))

    def _input_dtypes_by_signature(self, model: _ModelInfo) -> dict[str, dict[str, str]]:
        """``GetInfoMap`` of each signature of the servable ``model`` names now, so that a
        worker decodes a large body in one pass; ``{}`` when there is none (the lookup's error
        is reported after the body's, when the request is predicted)."""
        try:
            with self._manager.acquire(model.spec()) as handle:
                servable = handle.servable
                return {name: servable.input_dtypes(name) for name in servable.signature_defs}
        except ServingError:
            return {}

    async def _encode_predict_outputs(
        self, outputs: dict[str, np.ndarray], fmt: json_tensor.JsonFormat
    ) -> bytes:
        """``MakeJsonFromTensors``, on the codec executor for a large answer."""
        if self._codec is None or (
            sum(array.size for array in outputs.values()) < CODEC_OFFLOAD_OUTPUT_ELEMENTS
        ):
            return json_tensor.encode_predict_outputs(outputs, fmt)
        return await self._codec.run(json_tensor.encode_predict_outputs, outputs, fmt)

    async def _classify(self, model: _ModelInfo, body: bytes) -> Response:
        """``ProcessClassifyRequest``: JSON -> tf.Examples, classify, JSON."""
        response = await self._inference.classify(
            await self._example_request(model, body), timeout_ms=self._timeout_ms
        )
        return self._ok(json_example.encode_classification_result(response.result))

    async def _regress(self, model: _ModelInfo, body: bytes) -> Response:
        """``ProcessRegressRequest``: JSON -> tf.Examples, regress, JSON."""
        response = await self._inference.regress(
            await self._example_request(model, body), timeout_ms=self._timeout_ms
        )
        return self._ok(json_example.encode_regression_result(response.values))

    async def _example_request(self, model: _ModelInfo, body: bytes) -> ExampleRequest:
        """``FillClassificationRequestFromJson`` / ``FillRegressionRequestFromJson``."""
        if self._codec is None or len(body) < CODEC_OFFLOAD_BODY_BYTES:
            signature, examples = json_example.decode_example_request(body)
        else:
            signature, examples = await self._codec.run(json_example.decode_example_request, body)
        self._limits.check_elements(len(examples), "tf.Examples")
        return ExampleRequest(model.spec(signature), examples)


class _ModelInfo(NamedTuple):
    """The model a path names (``ParseModelInfo``): all of the request's ``ModelSpec`` but the
    signature, which only the body says. Parsed before the body, so a bad version in the path is
    reported first, as in TF Serving; the spec is then built once, with the body's signature."""

    name: str
    version: int | None
    label: str | None

    def spec(self, signature_name: str = "") -> ModelSpec:
        """``FillModelSpecWithNameVersionAndLabel`` plus the signature."""
        return ModelSpec(self.name, self.version, self.label, signature_name)


def _model_info(name: str, version: str | None, label: str | None) -> _ModelInfo:
    """``ParseModelInfo``: the path's name and label URL-decoded, its version an int64."""
    parsed_version = None
    if version:
        parsed_version = int(version)
        if parsed_version > _INT64_MAX:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Failed to convert version: {version} to numeric."
            )
    return _ModelInfo(
        unquote(name) if name else name, parsed_version, unquote(label) if label else None
    )
