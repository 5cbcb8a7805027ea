"""What the serving tier is sent: feature rows from generated transactions, as REST bodies and
as serialized gRPC ``PredictRequest``s (the API's own protos: no TensorFlow import)."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import orjson

from bench.processes import REPO

MODEL_NAME = "fraud"
MODEL_DIR = REPO / "models" / "fraud"
INPUT_NAME = "features"
OUTPUT_NAME = "fraud_score"  # float32 [rows, 1]
N_FEATURES = 11
POOL_REQUESTS = 64
PREDICT_METHOD = "/tensorflow.serving.PredictionService/Predict"
#: gRPC's length prefix: 1 byte compressed flag, 4 bytes big-endian message length.
GRPC_PREFIX = struct.Struct(">BI")
#: Seconds a call (REST, Python generator) or an h2load connection may stay silent: an error.
CALL_TIMEOUT_S = 10.0


def feature_rows(n: int, seed: int = 2026) -> np.ndarray:
    """``n`` feature vectors, float32 ``[n, 11]``, from generated transactions (the API's own
    validation and feature extraction, as in production)."""
    from examples.fraud.features import extract_features
    from examples.fraud.schemas import Transaction
    from models.transactions import generate_transactions

    rows = [
        extract_features(Transaction.model_validate(labeled.body))
        for labeled in generate_transactions(n, seed=seed)
    ]
    return np.asarray(rows, np.float32)


def request_batches(rows_per_request: int, count: int = POOL_REQUESTS) -> list[np.ndarray]:
    """``count`` distinct requests of ``rows_per_request`` rows each (rows reused cyclically)."""
    rows = feature_rows(min(4096, rows_per_request * count))
    return [
        np.take(rows, range(i * rows_per_request, (i + 1) * rows_per_request), axis=0, mode="wrap")
        for i in range(count)
    ]


def write_rest_pool(path: Path, rows_per_request: int) -> Path:
    """The REST body pool: one ``{"instances": [[11 floats], ...]}`` document per line."""
    lines = [
        orjson.dumps({"instances": batch.tolist()}) for batch in request_batches(rows_per_request)
    ]
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def grpc_requests(rows_per_request: int) -> list[bytes]:
    """Serialized ``PredictRequest``s, inputs in ``tensor_content`` (the API's wire-compatible
    protos: no TensorFlow import in the load generator)."""
    from api.protos.tensorflow.core.framework import tensor_pb2, types_pb2
    from api.protos.tensorflow_serving.apis import predict_pb2

    out = []
    for batch in request_batches(rows_per_request):
        request = predict_pb2.PredictRequest()
        request.model_spec.name = MODEL_NAME
        request.model_spec.signature_name = "serving_default"
        tensor = tensor_pb2.TensorProto(dtype=types_pb2.DT_FLOAT)
        for size in batch.shape:
            tensor.tensor_shape.dim.add(size=size)
        tensor.tensor_content = np.ascontiguousarray(batch, "<f4").tobytes()
        request.inputs[INPUT_NAME].CopyFrom(tensor)
        out.append(request.SerializeToString())
    return out


def grpc_frame(message: bytes) -> bytes:
    """One gRPC length-prefixed message, as it travels in an HTTP/2 DATA frame: a 0 byte (not
    compressed), the message's length as 4 bytes big-endian, then the message."""
    return GRPC_PREFIX.pack(0, len(message)) + message


def write_grpc_body(path: Path, message: bytes) -> Path:
    """h2load's ``--data`` file: ``message`` (a serialized ``PredictRequest``) framed for gRPC.
    h2load sends this same body with every request."""
    path.write_bytes(grpc_frame(message))
    return path


