"""The API's authentication on the OIP gRPC front: the request middleware's front door
(`api.security.front_door.FrontDoor`) checks every gRPC call through the call hook
(`api.oip.hooks.front_door_check`). Both tiers as real processes (the API as one uvicorn process)."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Iterator

import grpc
import pytest

from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from tests.support import Serving, free_port, http_ok, start_api

KEY = secrets.token_urlsafe(32)


@pytest.fixture(scope="module")
def grpc_target(example_serving: Serving, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The API with authentication on (one API key) and the OIP front on fraud; its gRPC target."""
    tmp = tmp_path_factory.mktemp("oip-front-door")
    keys = tmp / "api-keys"
    keys.write_text(f"oip-test sha256:{hashlib.sha256(KEY.encode()).hexdigest()}\n")
    port, grpc_port = free_port(), free_port()
    api = start_api(
        port,
        example_serving.rest_url,
        tmp / "api.log",
        AUTH__ENABLED="true",
        AUTH__API_KEYS_FILE=str(keys),
        OIP__MODELS="fraud",
        OIP__GRPC_PORT=str(grpc_port),
        OIP__GRPC_HOST="127.0.0.1",
    )
    try:
        api.wait_ready(lambda: http_ok(f"http://127.0.0.1:{port}/readyz"), 60, "/readyz")
        yield f"127.0.0.1:{grpc_port}"
    finally:
        api.stop()


def _infer(target: str, metadata: tuple[tuple[str, str], ...]) -> pb.ModelInferResponse:
    tensor = pb.ModelInferRequest.InferInputTensor(
        name="features", datatype="FP32", shape=[1, 11], contents=pb.InferTensorContents(fp32_contents=[0.5] * 11)
    )
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        return stub.ModelInfer(pb.ModelInferRequest(model_name="fraud", inputs=[tensor]), metadata=metadata, timeout=10)


@pytest.mark.parametrize(
    ("metadata", "detail"),
    [((), "missing credential"), ((("x-api-key", "w" * 40),), "invalid API key")],
    ids=["no key", "wrong key"],
)
def test_a_call_without_a_valid_key_is_unauthenticated(
    grpc_target: str, metadata: tuple[tuple[str, str], ...], detail: str
) -> None:
    with pytest.raises(grpc.RpcError) as refused:
        _infer(grpc_target, metadata)
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert detail in (refused.value.details() or "")


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
def test_a_call_with_the_key_is_answered(grpc_target: str, header: str) -> None:
    value = KEY if header == "x-api-key" else f"Bearer {KEY}"
    reply = _infer(grpc_target, ((header, value),))
    assert [o.name for o in reply.outputs] == ["fraud_score"]
    assert 0.0 <= reply.outputs[0].contents.fp32_contents[0] <= 1.0
