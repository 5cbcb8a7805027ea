"""A test-only stand-in for the serving tier, speaking TF Serving's REST and gRPC APIs.

    python -m tests.api.fake_serving --rest-port 8501 [--grpc-port 8500] [--models fraud,digits]
        [--service-ms 40 --slots 4] [--versions '{"fraud": {"1": "AVAILABLE", "2": "LOADING"}}']
        [--labels '{"fraud": {"stable": 1}}'] [--error-models shadow]

It "serves" every model named in `--models` as version 1, AVAILABLE (or the versions and
states `--versions` gives), with the example exports' SignatureDefs as its metadata
(`SIGNATURES`), and answers any predict with `fake_scores`: for each input row,
1 / (1 + exp(-sum(row) - (version - 1))) (version 1: the logistic of the row's sum), as an
output named after the model's real one (`fraud_score`, shape [batch, 1]). Tests compare the
API's answers to that function, which proves rows travel and come back in order, and which
version answered.

Versions and labels follow TF Serving (server_core.cc, get_model_status_impl.cc): a predict or
metadata call for a version that is not AVAILABLE is NOT_FOUND ("Servable not found for
request: Specific(m, v)"), no version is the latest AVAILABLE one, a label (`--labels`) names a
version (an unknown one is INVALID_ARGUMENT "Unrecognized servable version label: l"), model
status lists every version with its state, and metadata names the version it resolved.

It is test-only because it can be told to misbehave, over REST on its own port:
`POST /_fake/hold` makes predicts wait (they are counted as pending) until
`POST /_fake/release` (`?model=m`: that model's predicts only); `POST /_fake/versions` and
`POST /_fake/labels` replace the versions' states and the labels (same JSON as the flags);
`GET /_fake/stats` says how many predicts it ran, how many rows each had, and how many each
`model:version` ran. `--error-models` answer every predict with INTERNAL. `--service-ms` /
`--slots` make it a model of finite capacity: each predict holds one of `slots` for
`service-ms` (asleep, no CPU), so at most slots / service-ms predicts a millisecond are served
and more queue; like TF Serving, it finishes a predict whose caller went away. The gRPC side
uses the OFFICIAL generated stubs (`tensorflow_serving.apis`), so the API's own protos are
checked against them on the wire; importing them loads TensorFlow, so it happens only with
`--grpc-port`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import signal
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

OUTPUT_NAMES = {"fraud": "fraud_score", "digits": "probabilities"}

# The `serving_default` SignatureDefs of the example exports (`saved_model_cli show`):
# alias -> (dtype, shape), for model metadata (the API's readiness checks them).
SIGNATURES: dict[str, tuple[dict[str, tuple[str, list[int]]], dict[str, tuple[str, list[int]]]]] = {
    "fraud": ({"features": ("DT_FLOAT", [-1, 11])}, {"fraud_score": ("DT_FLOAT", [-1, 1])}),
    "digits": ({"image": ("DT_FLOAT", [-1, 8, 8, 1])}, {"probabilities": ("DT_FLOAT", [-1, 10])}),
}


def kind(name: str) -> str:
    """Which example's signature a model has: a name starting with `fraud` (`fraud_shadow`,
    `fraud_transformer`) is served as fraud, one starting with `digits` as digits."""
    return next((k for k in SIGNATURES if name.startswith(k)), name)


def signature_def_json(name: str) -> dict[str, Any]:
    """`signature_def` of TF Serving's REST metadata answer for model `name`."""

    def infos(tensors: dict[str, tuple[str, list[int]]]) -> dict[str, Any]:
        return {
            alias: {
                "dtype": dtype,
                "tensor_shape": {"dim": [{"size": str(d), "name": ""} for d in shape], "unknown_rank": False},
                "name": f"serving_default_{alias}:0",
            }
            for alias, (dtype, shape) in tensors.items()
        }

    inputs, outputs = SIGNATURES.get(kind(name), ({}, {}))
    signature = {"inputs": infos(inputs), "outputs": infos(outputs), "method_name": "tensorflow/serving/predict"}
    return {"signature_def": {"serving_default": signature}}


def fake_score(row: Sequence[float], version: int = 1) -> float:
    """The fake model: logistic of the row's sum, shifted by the version (float64)."""
    return 1.0 / (1.0 + math.exp(-sum(row) - (version - 1)))


class NotServed(Exception):
    """A lookup TF Serving refuses: `code` is the canonical code's name, `message` its text."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


#: Canonical code -> TF Serving's REST status (http_server.cc ToHTTPStatusCode).
HTTP_STATUS = {"NOT_FOUND": 404, "INVALID_ARGUMENT": 400, "INTERNAL": 500}


class FakeModel:
    """State shared by the REST and gRPC front ends."""

    def __init__(
        self,
        models: Sequence[str],
        service_s: float = 0.0,
        slots: int = 0,
        versions: dict[str, dict[int, str]] | None = None,
        labels: dict[str, dict[str, int]] | None = None,
        error_models: Sequence[str] = (),
    ) -> None:
        self.models = set(models)
        self.versions = {m: {1: "AVAILABLE"} for m in self.models}
        self.set_versions(versions or {})
        self.labels: dict[str, dict[str, int]] = labels or {}
        self.error_models = set(error_models)
        self.batches: list[int] = []
        self.ran: Counter[str] = Counter()  # "model:version" -> predicts
        self.pending = 0
        self.open = asyncio.Event()
        self.open.set()
        self.held: set[str] = set()
        self.released = asyncio.Event()
        self.service_s = service_s
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.huge_bytes = 0  # > 0: predicts answer a body this large (POST /_fake/huge?bytes=N)

    def set_versions(self, versions: dict[str, dict[int, str]]) -> None:
        for name, states in versions.items():
            self.models.add(name)
            self.versions[name] = {int(v): state for v, state in states.items()}

    def resolve(self, name: str, version: int | None, label: str | None) -> int:
        """`ServerCore::GetServableHandle`: the version a call for `name` runs, or `NotServed`."""
        if label is not None:
            labelled = self.labels.get(name, {}).get(label)
            if labelled is None:
                raise NotServed("INVALID_ARGUMENT", f"Unrecognized servable version label: {label}")
            version = labelled
        states = self.versions.get(name, {}) if name in self.models else {}
        available = [v for v, state in states.items() if state == "AVAILABLE"]
        if version is None:
            if not available:
                raise NotServed("NOT_FOUND", f"Servable not found for request: Latest({name})")
            return max(available)
        if version not in available:
            raise NotServed("NOT_FOUND", f"Servable not found for request: Specific({name}, {version})")
        return version

    def status(self, name: str) -> list[tuple[int, str]]:
        """`GetModelStatus` of every version, or NOT_FOUND."""
        if name not in self.models or not self.versions.get(name):
            raise NotServed("NOT_FOUND", f"Could not find any versions of model {name}")
        return sorted(self.versions[name].items(), reverse=True)

    async def predict(self, name: str, version: int, rows: list[list[float]]) -> list[float]:
        self.pending += 1
        try:
            await self.open.wait()
            while name in self.held:
                self.released.clear()
                await self.released.wait()
            if self.slots is not None:
                async with self.slots:
                    await asyncio.sleep(self.service_s)
        finally:
            self.pending -= 1
        if name in self.error_models:
            raise NotServed("INTERNAL", f"fake serving: model {name} fails every predict")
        self.batches.append(len(rows))
        self.ran[f"{name}:{version}"] += 1
        return [fake_score(r, version) for r in rows]


def _model_path(rest: str) -> tuple[str, int | None, str | None, str]:
    """`name[/versions/v | /labels/l][/metadata | :verb]` -> (name, version, label, verb or "metadata")."""
    path, _, verb = rest.partition(":")
    parts = path.split("/")
    name, version, label = unquote(parts[0]), None, None
    if len(parts) >= 3 and parts[1] == "versions":
        version = int(parts[2])
    elif len(parts) >= 3 and parts[1] == "labels":
        label = unquote(parts[2])
    if parts[-1] == "metadata" and len(parts) in (2, 4):
        verb = "metadata"
    return name, version, label, verb


def rest_app(model: FakeModel) -> Starlette:
    def error(status: int, message: str) -> Response:
        return JSONResponse({"error": message}, status_code=status)

    async def models(request: Request) -> Response:
        rest: str = request.path_params["rest"]
        name, version, label, verb = _model_path(rest)
        try:
            if request.method == "GET" and verb == "metadata":
                resolved = model.resolve(name, version, label)
                spec = {"name": name, "signature_name": "", "version": str(resolved)}
                return JSONResponse({"model_spec": spec, "metadata": {"signature_def": signature_def_json(name)}})
            if request.method == "GET" and not verb:
                ok = {"error_code": "OK", "error_message": ""}
                entries = [{"version": str(v), "state": state, "status": ok} for v, state in model.status(name)]
                return JSONResponse({"model_version_status": entries})
            if request.method == "POST" and verb == "predict":
                resolved = model.resolve(name, version, label)
                body = orjson.loads(await request.body())
                inputs = body.get("inputs")
                if not isinstance(inputs, dict) or len(inputs) != 1:
                    return error(400, "fake serving takes one named input in the columnar format")
                (rows,) = inputs.values()
                flat_rows = [_flatten(r) for r in rows]
                scores = await model.predict(name, resolved, flat_rows)
                if model.huge_bytes:  # a faulty replica: announces (and streams) a huge body
                    return StreamingResponse(
                        _zeros(model.huge_bytes),
                        media_type="application/json",
                        headers={"content-length": str(model.huge_bytes)},
                    )
                return Response(orjson.dumps({"outputs": [[s] for s in scores]}), media_type="application/json")
        except NotServed as exc:
            return error(HTTP_STATUS[exc.code], exc.message)
        return error(404, f"no such endpoint: {request.method} {rest}")

    async def hold(request: Request) -> Response:
        held = request.query_params.get("model")
        if held:
            model.held.add(held)
        else:
            model.open.clear()
        return JSONResponse({"held": True})

    async def release(request: Request) -> Response:
        model.held.clear()
        model.released.set()
        model.open.set()
        return JSONResponse({"held": False})

    async def huge(request: Request) -> Response:
        model.huge_bytes = int(request.query_params.get("bytes", "0"))
        return JSONResponse({"huge_bytes": model.huge_bytes})
    async def versions(request: Request) -> Response:
        model.set_versions(json.loads(await request.body()))
        return JSONResponse({"versions": {m: v for m, v in model.versions.items()}})

    async def labels(request: Request) -> Response:
        model.labels = json.loads(await request.body())
        return JSONResponse({"labels": model.labels})

    async def stats(request: Request) -> Response:
        return JSONResponse({"batches": model.batches, "pending": model.pending, "ran": dict(model.ran)})

    return Starlette(
        routes=[
            Route("/v1/models/{rest:path}", models, methods=["GET", "POST"]),
            Route("/_fake/hold", hold, methods=["POST"]),
            Route("/_fake/release", release, methods=["POST"]),
            Route("/_fake/versions", versions, methods=["POST"]),
            Route("/_fake/labels", labels, methods=["POST"]),
            Route("/_fake/stats", stats, methods=["GET"]),
            Route("/_fake/huge", huge, methods=["POST"]),
        ]
    )


async def _zeros(size: int) -> Any:
    chunk = b"0" * (1 << 20)
    while size > 0:
        yield chunk[:size]
        size -= len(chunk)


def _flatten(value: Any) -> list[float]:
    if isinstance(value, list):
        return [x for item in value for x in _flatten(item)]
    return [float(value)]


async def grpc_server(model: FakeModel, port: int, host: str = "127.0.0.1") -> Any:
    import grpc
    from tensorflow.core.framework import types_pb2
    from tensorflow_serving.apis import (  # official stubs: imports TensorFlow
        get_model_metadata_pb2,
        get_model_status_pb2,
        model_service_pb2_grpc,
        predict_pb2,
        prediction_service_pb2_grpc,
    )

    async def resolve(spec: Any, context: Any) -> int:
        choice = spec.WhichOneof("version_choice")
        version = spec.version.value if choice == "version" else None
        label = spec.version_label if choice == "version_label" else None
        try:
            return model.resolve(spec.name, version, label)
        except NotServed as exc:
            await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            raise AssertionError("unreachable: abort raises") from exc

    class Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC name)
            name = request.model_spec.name
            version = await resolve(request.model_spec, context)
            if len(request.inputs) != 1:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "fake serving takes one input")
            (tensor,) = request.inputs.values()
            dims = [d.size for d in tensor.tensor_shape.dim]
            width = math.prod(dims[1:])
            if tensor.tensor_content:
                flat = struct.unpack(f"<{len(tensor.tensor_content) // 4}f", tensor.tensor_content)
            else:
                flat = tuple(tensor.float_val)
            rows = [list(flat[i * width : (i + 1) * width]) for i in range(dims[0])]
            try:
                scores = await model.predict(name, version, rows)
            except NotServed as exc:
                await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = version
            response.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
            out = response.outputs[OUTPUT_NAMES.get(kind(name), "output_0")]
            out.dtype = 1  # DT_FLOAT
            out.tensor_shape.dim.add().size = len(scores)
            out.tensor_shape.dim.add().size = 1
            out.tensor_content = struct.pack(f"<{len(scores)}f", *scores)
            return response

        async def GetModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
            name = request.model_spec.name
            version = await resolve(request.model_spec, context)
            signatures = get_model_metadata_pb2.SignatureDefMap()
            signature = signatures.signature_def["serving_default"]
            signature.method_name = "tensorflow/serving/predict"
            inputs, outputs = SIGNATURES.get(kind(name), ({}, {}))
            for tensors, target in ((inputs, signature.inputs), (outputs, signature.outputs)):
                for alias, (dtype, shape) in tensors.items():
                    info = target[alias]
                    info.name = f"serving_default_{alias}:0"
                    info.dtype = types_pb2.DataType.Value(dtype)
                    for size in shape:
                        info.tensor_shape.dim.add().size = size
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = version
            response.metadata["signature_def"].Pack(signatures)
            return response

    class Models(model_service_pb2_grpc.ModelServiceServicer):
        async def GetModelStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
            try:
                states = model.status(request.model_spec.name)
            except NotServed as exc:
                await context.abort(getattr(grpc.StatusCode, exc.code), exc.message)
            response = get_model_status_pb2.GetModelStatusResponse()
            for version, state in states:
                entry = response.model_version_status.add()
                entry.version = version
                entry.state = get_model_status_pb2.ModelVersionStatus.State.Value(state)
            return response

    server = grpc.aio.server()
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Prediction(), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(Models(), server)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server


async def main(args: argparse.Namespace) -> None:
    model = FakeModel(
        args.models.split(","),
        args.service_ms / 1000,
        args.slots,
        versions=json.loads(args.versions) if args.versions else None,
        labels=json.loads(args.labels) if args.labels else None,
        error_models=[m for m in args.error_models.split(",") if m],
    )
    grpc = await grpc_server(model, args.grpc_port, args.host) if args.grpc_port else None
    config = uvicorn.Config(rest_app(model), host=args.host, port=args.rest_port, log_level="warning")
    server = uvicorn.Server(config)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, lambda: setattr(server, "should_exit", True))
    await server.serve()
    if grpc is not None:
        await grpc.stop(0)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rest-port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1", help="address both ports bind to")
    parser.add_argument("--grpc-port", type=int, default=0)
    parser.add_argument("--models", default="fraud,digits")
    parser.add_argument("--service-ms", type=float, default=0.0, help="each predict holds a slot this long")
    parser.add_argument("--slots", type=int, default=0, help="predicts served at once (0: no limit)")
    parser.add_argument("--versions", default="", help='JSON: {"model": {"version": "STATE", ...}, ...}')
    parser.add_argument("--labels", default="", help='JSON: {"model": {"label": version, ...}, ...}')
    parser.add_argument("--error-models", default="", help="models whose every predict fails INTERNAL")
    asyncio.run(main(parser.parse_args()))
