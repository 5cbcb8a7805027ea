"""A test-only stand-in for the serving tier, speaking TF Serving's REST and gRPC APIs.

    python -m tests.api.fake_serving --rest-port 8501 [--grpc-port 8500] [--models fraud,digits]
        [--service-ms 40 --slots 4]

It "serves" every model named in `--models` as version 1, AVAILABLE, with the example
exports' SignatureDefs as its metadata (`SIGNATURES`), and answers any predict with
`fake_scores`: for each input row, 1 / (1 + exp(-sum(row))), as an output
named after the model's real one (`fraud_score`, shape [batch, 1]). Tests compare the
API's answers to that function, which proves rows travel and come back in order.

It is test-only because it can be told to misbehave, over REST on its own port:
`POST /_fake/hold` makes predicts wait (they are counted as pending) until
`POST /_fake/release`; `GET /_fake/stats` says how many predicts it ran and how many
rows each had. `--service-ms` / `--slots` make it a model of finite capacity: each predict
holds one of `slots` for `service-ms` (asleep, no CPU), so at most slots / service-ms
predicts a millisecond are served and more queue; like TF Serving, it finishes a predict
whose caller went away. The gRPC side uses the OFFICIAL generated stubs
(`tensorflow_serving.apis`), so the API's own protos are checked against them on the
wire; importing them loads TensorFlow, so it happens only with `--grpc-port`.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import signal
import struct
from collections.abc import Sequence
from typing import Any

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

    inputs, outputs = SIGNATURES.get(name, ({}, {}))
    signature = {"inputs": infos(inputs), "outputs": infos(outputs), "method_name": "tensorflow/serving/predict"}
    return {"signature_def": {"serving_default": signature}}


def fake_score(row: Sequence[float]) -> float:
    """The fake model: logistic of the row's sum (float64)."""
    return 1.0 / (1.0 + math.exp(-sum(row)))


class FakeModel:
    """State shared by the REST and gRPC front ends."""

    def __init__(self, models: Sequence[str], service_s: float = 0.0, slots: int = 0) -> None:
        self.models = set(models)
        self.batches: list[int] = []
        self.pending = 0
        self.open = asyncio.Event()
        self.open.set()
        self.service_s = service_s
        self.slots = asyncio.Semaphore(slots) if slots else None
        self.huge_bytes = 0  # > 0: predicts answer a body this large (POST /_fake/huge?bytes=N)

    async def predict(self, rows: list[list[float]]) -> list[float]:
        self.pending += 1
        try:
            await self.open.wait()
            if self.slots is not None:
                async with self.slots:
                    await asyncio.sleep(self.service_s)
        finally:
            self.pending -= 1
        self.batches.append(len(rows))
        return [fake_score(r) for r in rows]


def rest_app(model: FakeModel) -> Starlette:
    def error(status: int, message: str) -> Response:
        return JSONResponse({"error": message}, status_code=status)

    async def models(request: Request) -> Response:
        rest: str = request.path_params["rest"]
        name, _, verb = rest.partition(":")
        name = name.split("/")[0]
        if name not in model.models:
            return error(404, f"Servable not found for request: Latest({name})")
        if request.method == "GET" and rest.endswith("/metadata"):
            spec = {"name": name, "signature_name": "", "version": "1"}
            return JSONResponse({"model_spec": spec, "metadata": {"signature_def": signature_def_json(name)}})
        if request.method == "GET" and not verb:
            status = {"version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}}
            return JSONResponse({"model_version_status": [status]})
        if request.method == "POST" and verb == "predict":
            body = orjson.loads(await request.body())
            inputs = body.get("inputs")
            if not isinstance(inputs, dict) or len(inputs) != 1:
                return error(400, "fake serving takes one named input in the columnar format")
            (rows,) = inputs.values()
            flat_rows = [_flatten(r) for r in rows]
            scores = await model.predict(flat_rows)
            if model.huge_bytes:  # a faulty replica: announces (and streams) a huge body
                return StreamingResponse(
                    _zeros(model.huge_bytes),
                    media_type="application/json",
                    headers={"content-length": str(model.huge_bytes)},
                )
            return Response(orjson.dumps({"outputs": [[s] for s in scores]}), media_type="application/json")
        return error(404, f"no such endpoint: {request.method} {rest}")

    async def hold(request: Request) -> Response:
        model.open.clear()
        return JSONResponse({"held": True})

    async def release(request: Request) -> Response:
        model.open.set()
        return JSONResponse({"held": False})

    async def huge(request: Request) -> Response:
        model.huge_bytes = int(request.query_params.get("bytes", "0"))
        return JSONResponse({"huge_bytes": model.huge_bytes})

    async def stats(request: Request) -> Response:
        return JSONResponse({"batches": model.batches, "pending": model.pending})

    return Starlette(
        routes=[
            Route("/v1/models/{rest:path}", models, methods=["GET", "POST"]),
            Route("/_fake/hold", hold, methods=["POST"]),
            Route("/_fake/release", release, methods=["POST"]),
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

    class Prediction(prediction_service_pb2_grpc.PredictionServiceServicer):
        async def Predict(self, request: Any, context: Any) -> Any:  # noqa: N802 (gRPC name)
            name = request.model_spec.name
            if name not in model.models:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({name})")
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
            scores = await model.predict(rows)
            response = predict_pb2.PredictResponse()
            response.model_spec.name = name
            response.model_spec.version.value = 1
            response.model_spec.signature_name = request.model_spec.signature_name or "serving_default"
            out = response.outputs[OUTPUT_NAMES.get(name, "output_0")]
            out.dtype = 1  # DT_FLOAT
            out.tensor_shape.dim.add().size = len(scores)
            out.tensor_shape.dim.add().size = 1
            out.tensor_content = struct.pack(f"<{len(scores)}f", *scores)
            return response

        async def GetModelMetadata(self, request: Any, context: Any) -> Any:  # noqa: N802
            name = request.model_spec.name
            if name not in model.models:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"Servable not found for request: Latest({name})")
            signatures = get_model_metadata_pb2.SignatureDefMap()
            signature = signatures.signature_def["serving_default"]
            signature.method_name = "tensorflow/serving/predict"
            inputs, outputs = SIGNATURES.get(name, ({}, {}))
            for tensors, target in ((inputs, signature.inputs), (outputs, signature.outputs)):
                for alias, (dtype, shape) in tensors.items():
                    info = target[alias]
                    info.name = f"serving_default_{alias}:0"
                    info.dtype = types_pb2.DataType.Value(dtype)
                    for size in shape:
                        info.tensor_shape.dim.add().size = size
            response = get_model_metadata_pb2.GetModelMetadataResponse()
            response.model_spec.name = name
            response.model_spec.version.value = 1
            response.metadata["signature_def"].Pack(signatures)
            return response

    class Models(model_service_pb2_grpc.ModelServiceServicer):
        async def GetModelStatus(self, request: Any, context: Any) -> Any:  # noqa: N802
            name = request.model_spec.name
            if name not in model.models:
                await context.abort(grpc.StatusCode.NOT_FOUND, f"Could not find any versions of model {name}")
            response = get_model_status_pb2.GetModelStatusResponse()
            entry = response.model_version_status.add()
            entry.version = 1
            entry.state = get_model_status_pb2.ModelVersionStatus.AVAILABLE
            return response

    server = grpc.aio.server()
    prediction_service_pb2_grpc.add_PredictionServiceServicer_to_server(Prediction(), server)
    model_service_pb2_grpc.add_ModelServiceServicer_to_server(Models(), server)
    server.add_insecure_port(f"{host}:{port}")
    await server.start()
    return server


async def main(args: argparse.Namespace) -> None:
    model = FakeModel(args.models.split(","), args.service_ms / 1000, args.slots)
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
    asyncio.run(main(parser.parse_args()))
