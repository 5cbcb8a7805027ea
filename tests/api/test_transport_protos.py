"""The API's own TF Serving protos (`api.protos`) against the official ones, byte for byte.

The official messages come from `tensorflow-serving-api` (which imports TensorFlow, so
only this test process loads them); ours are what the API sends. Both live in one
process because ours are registered in a descriptor pool of their own
(`api.protos._pool`).
"""

from __future__ import annotations

import os
import subprocess
import sys
from array import array

import pytest

from api.protos.tensorflow.core.framework import tensor_pb2 as our_tensor_pb2
from api.protos.tensorflow_serving.apis import (
    get_model_metadata_pb2 as our_metadata_pb2,
)
from api.protos.tensorflow_serving.apis import (
    get_model_status_pb2 as our_status_pb2,
)
from api.protos.tensorflow_serving.apis import (
    model_service_pb2_grpc as our_model_service,
)
from api.protos.tensorflow_serving.apis import (
    predict_pb2 as our_predict_pb2,
)
from api.protos.tensorflow_serving.apis import (
    prediction_service_pb2_grpc as our_prediction_service,
)
from api.serving_client import DataType, ModelSpec, PredictRequest, Tensor, TensorInfo
from api.serving_client._tensor_proto import (
    model_metadata_from_proto,
    model_metadata_request,
    model_status_from_proto,
    predict_request_to_proto,
    predict_response_from_proto,
    tensor_from_proto,
    tensor_to_proto,
)
from tests.support import REPO

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
official = pytest.importorskip("tensorflow_serving.apis.predict_pb2")
from tensorflow.core.framework import tensor_pb2 as official_tensor_pb2  # noqa: E402
from tensorflow_serving.apis import get_model_metadata_pb2 as official_metadata_pb2  # noqa: E402
from tensorflow_serving.apis import get_model_status_pb2 as official_status_pb2  # noqa: E402
from tensorflow_serving.apis import model_service_pb2 as official_model_service_pb2  # noqa: E402
from tensorflow_serving.apis import prediction_service_pb2 as official_prediction_pb2  # noqa: E402

ROWS = [[0.5, -1.25, 3.0], [1e-3, 2.5e7, -0.0]]


def our_request() -> our_predict_pb2.PredictRequest:
    return predict_request_to_proto(
        PredictRequest(
            ModelSpec("fraud", "serving_default", 7),
            {"features": Tensor.from_rows(ROWS)},
            output_filter=("fraud_score",),
        )
    )


def test_our_predict_request_parses_as_the_official_one() -> None:
    wire = our_request().SerializeToString()
    parsed = official.PredictRequest.FromString(wire)
    assert parsed.model_spec.name == "fraud"
    assert parsed.model_spec.signature_name == "serving_default"
    assert parsed.model_spec.WhichOneof("version_choice") == "version"
    assert parsed.model_spec.version.value == 7
    assert list(parsed.output_filter) == ["fraud_score"]
    tensor = parsed.inputs["features"]
    assert tensor.dtype == official_tensor_pb2.TensorProto().dtype + 1  # DT_FLOAT
    assert [d.size for d in tensor.tensor_shape.dim] == [2, 3]
    assert array("f", tensor.tensor_content).tolist() == array("f", [v for r in ROWS for v in r]).tolist()
    # And the official message re-serialises to the very same bytes.
    assert parsed.SerializeToString(deterministic=True) == our_request().SerializeToString(deterministic=True)


def test_official_predict_request_parses_as_ours() -> None:
    msg = official.PredictRequest()
    msg.model_spec.name = "digits"
    msg.model_spec.version_label = "stable"
    msg.inputs["image"].dtype = 1
    msg.inputs["image"].tensor_shape.dim.add().size = 2
    msg.inputs["image"].float_val.extend([1.5, 2.5])
    # Fields our subset leaves out are kept as unknown fields, not lost or fatal.
    msg.client_id = b"caller-1"
    wire = msg.SerializeToString(deterministic=True)
    ours = our_predict_pb2.PredictRequest.FromString(wire)
    assert ours.model_spec.name == "digits"
    assert ours.model_spec.version_label == "stable"
    assert tensor_from_proto(ours.inputs["image"]) == Tensor((2,), [1.5, 2.5], DataType.DT_FLOAT)
    assert ours.SerializeToString(deterministic=True) == wire


def test_official_predict_response_decodes_with_the_version() -> None:
    msg = official.PredictResponse()
    msg.model_spec.name = "fraud"
    msg.model_spec.version.value = 3
    out = msg.outputs["fraud_score"]
    out.dtype = 1
    out.tensor_shape.dim.add().size = 2
    out.tensor_shape.dim.add().size = 1
    out.tensor_content = array("f", [0.25, float("nan")]).tobytes()
    ours = predict_response_from_proto(our_predict_pb2.PredictResponse.FromString(msg.SerializeToString()))
    assert ours.model_version == 3
    tensor = ours.outputs["fraud_score"]
    assert tensor.shape == (2, 1) and tensor.values[0] == 0.25
    assert tensor.values[1] != tensor.values[1]  # NaN survives as NaN


@pytest.mark.parametrize(
    ("dtype", "values"),
    [
        (DataType.DT_FLOAT, [1.0, -2.5, 3.25, 0.0]),
        (DataType.DT_DOUBLE, [1e300, -1e-300, 0.1, 2.0]),
        (DataType.DT_INT32, [-(2**31), 2**31 - 1, 0, 7]),
        (DataType.DT_INT64, [-(2**63), 2**63 - 1, 0, 7]),
        (DataType.DT_UINT8, [0, 255, 1, 2]),
        (DataType.DT_BOOL, [True, False, True, True]),
        (DataType.DT_STRING, [b"a", b"", b"\xff\x00", b"xyz"]),
    ],
)
def test_tensor_round_trip_through_the_official_tensorproto(dtype: DataType, values: list) -> None:
    import numpy as np
    import tensorflow as tf

    tensor = Tensor((2, 2), values, dtype)
    official_tensor = official_tensor_pb2.TensorProto.FromString(tensor_to_proto(tensor).SerializeToString())
    as_numpy = tf.make_ndarray(official_tensor)
    assert as_numpy.shape == (2, 2)
    assert as_numpy.reshape(-1).tolist() == values
    # TensorFlow's own encoder (typed *_val fields for small tensors) decodes to the same.
    # dtype=object: NumPy's fixed-width bytes would drop the trailing NUL of b"\xff\x00".
    array_in = np.asarray(values, dtype=object if dtype is DataType.DT_STRING else None)
    tf_made = tf.make_tensor_proto(array_in.reshape(2, 2), dtype=tf.as_dtype(int(dtype)))
    back = tensor_from_proto(our_tensor_pb2.TensorProto.FromString(tf_made.SerializeToString()))
    assert back == tensor


def test_float32_values_decode_to_the_decimals_rest_would_give() -> None:
    # gRPC carries float32 bits; REST (TF Serving's JSON) the shortest decimal that reads
    # back as the same float32. The API sees the same numbers either way.
    content = array("f", [0.20017244, 1.7972753e-12, 0.999997, 1.0, float("inf")]).tobytes()
    msg = our_tensor_pb2.TensorProto(dtype=1, tensor_content=content)
    msg.tensor_shape.dim.add().size = 5
    back = tensor_from_proto(msg)
    assert back.values == [0.20017244, 1.7972753e-12, 0.999997, 1.0, float("inf")]
    assert [repr(v) for v in back.values[:3]] == ["0.20017244", "1.7972753e-12", "0.999997"]


def test_a_single_typed_value_fills_the_shape() -> None:
    msg = official_tensor_pb2.TensorProto(dtype=1)
    for _ in range(3):
        msg.tensor_shape.dim.add().size = 2
    msg.float_val.append(0.5)
    back = tensor_from_proto(our_tensor_pb2.TensorProto.FromString(msg.SerializeToString()))
    assert back.shape == (2, 2, 2) and back.values == [0.5] * 8


def test_model_status_and_metadata_interoperate() -> None:
    msg = official_status_pb2.GetModelStatusResponse()
    for version, state in ((1, 50), (2, 30), (3, 20)):
        entry = msg.model_version_status.add()
        entry.version = version
        entry.state = state
    msg.model_version_status[2].status.error_code = 14
    msg.model_version_status[2].status.error_message = "loading"
    status = model_status_from_proto(our_status_pb2.GetModelStatusResponse.FromString(msg.SerializeToString()))
    assert [(v.version, v.state) for v in status.versions] == [(1, "END"), (2, "AVAILABLE"), (3, "LOADING")]
    assert status.versions[2].error_message == "loading"
    assert status.latest_available() == 2

    meta = official_metadata_pb2.GetModelMetadataResponse()
    sig_map = official_metadata_pb2.SignatureDefMap()
    sig = sig_map.signature_def["serving_default"]
    sig.method_name = "tensorflow/serving/predict"
    sig.inputs["features"].name = "serving_default_features:0"
    sig.inputs["features"].dtype = 1
    sig.inputs["features"].tensor_shape.dim.add().size = -1
    meta.metadata["signature_def"].Pack(sig_map)
    ours = our_metadata_pb2.GetModelMetadataResponse.FromString(meta.SerializeToString())
    unpacked = our_metadata_pb2.SignatureDefMap()
    assert ours.metadata["signature_def"].Unpack(unpacked)
    info = unpacked.signature_def["serving_default"].inputs["features"]
    assert (info.name, info.dtype, info.tensor_shape.dim[0].size) == ("serving_default_features:0", 1, -1)
    decoded = model_metadata_from_proto(ours, 4)
    assert decoded.version == 4 and decoded.signatures["serving_default"].method_name == "tensorflow/serving/predict"
    assert decoded.signatures["serving_default"].inputs["features"] == TensorInfo(
        DataType.DT_FLOAT, (-1,), "serving_default_features:0"
    )


def test_our_metadata_request_parses_as_the_official_one() -> None:
    parsed = official_metadata_pb2.GetModelMetadataRequest.FromString(
        model_metadata_request("digits", 3).SerializeToString()
    )
    assert (parsed.model_spec.name, parsed.model_spec.version.value) == ("digits", 3)
    assert list(parsed.metadata_field) == ["signature_def"]
    by_label = official_metadata_pb2.GetModelMetadataRequest.FromString(
        model_metadata_request("digits", None, "canary").SerializeToString()
    )
    assert by_label.model_spec.WhichOneof("version_choice") == "version_label"
    assert by_label.model_spec.version_label == "canary"
    latest = official_metadata_pb2.GetModelMetadataRequest.FromString(
        model_metadata_request("digits", None).SerializeToString()
    )
    assert latest.model_spec.WhichOneof("version_choice") is None


def test_a_label_travels_as_the_official_version_label_and_metadata_names_the_resolved_version() -> None:
    request = PredictRequest(ModelSpec("fraud", version_label="stable"), {"features": Tensor.from_rows(ROWS)})
    parsed = official.PredictRequest.FromString(predict_request_to_proto(request).SerializeToString())
    assert parsed.model_spec.WhichOneof("version_choice") == "version_label"
    assert parsed.model_spec.version_label == "stable"
    # GetModelMetadata by label: serving sets model_spec.version to the version it resolved
    # (get_model_metadata_impl.cc), which the decoded metadata carries.
    meta = official_metadata_pb2.GetModelMetadataResponse()
    meta.model_spec.name = "fraud"
    meta.model_spec.version.value = 5
    meta.metadata["signature_def"].Pack(official_metadata_pb2.SignatureDefMap())
    ours = our_metadata_pb2.GetModelMetadataResponse.FromString(meta.SerializeToString())
    assert model_metadata_from_proto(ours, None).version == 5
    with pytest.raises(ValueError, match="both a version"):
        ModelSpec("fraud", version=1, version_label="stable")


def test_grpc_method_paths_are_tf_servings() -> None:
    prediction = official_prediction_pb2.DESCRIPTOR.services_by_name["PredictionService"]
    model_service = official_model_service_pb2.DESCRIPTOR.services_by_name["ModelService"]
    official_paths = {
        f"/{prediction.full_name}/{m.name}" for m in prediction.methods
    } | {f"/{model_service.full_name}/{m.name}" for m in model_service.methods}

    class Recorder:
        def __init__(self) -> None:
            self.paths: list[str] = []

        def unary_unary(self, path: str, **_: object) -> None:
            self.paths.append(path)

    channel = Recorder()
    our_prediction_service.PredictionServiceStub(channel)
    our_model_service.ModelServiceStub(channel)
    assert set(channel.paths) == {
        "/tensorflow.serving.PredictionService/Predict",
        "/tensorflow.serving.PredictionService/GetModelMetadata",
        "/tensorflow.serving.ModelService/GetModelStatus",
    }
    assert set(channel.paths) <= official_paths


def test_the_protos_load_without_tensorflow() -> None:
    probe = (
        "import sys\n"
        "from api.serving_client._grpc import GrpcTransport\n"
        "from api.protos.tensorflow_serving.apis import get_model_metadata_pb2\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'tensorflow_serving', 'numpy')]\n"
        "print('HEAVY:' + ','.join(heavy))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "HEAVY:", out.stdout


def test_generated_code_is_up_to_date(tmp_path) -> None:  # type: ignore[no-untyped-def]
    """`make protos` on the committed .proto sources reproduces the committed code."""
    import shutil

    pytest.importorskip("grpc_tools")
    copy = tmp_path / "api" / "protos"
    shutil.copytree(REPO / "api" / "protos", copy, ignore=shutil.ignore_patterns("__pycache__"))
    (tmp_path / "api" / "__init__.py").write_text("")
    out = subprocess.run(
        [sys.executable, "-m", "api.protos.generate"], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for generated in sorted((REPO / "api" / "protos").rglob("*_pb2*.py*")):
        relative = generated.relative_to(REPO / "api" / "protos")
        assert (copy / relative).read_text() == generated.read_text(), f"{relative} is stale: run make protos"
