"""The API's authentication and rate limits on the OIP gRPC front: the request middleware's front
door (`api.security.front_door.FrontDoor`) checks every gRPC call through the call hook
(`api.oip.hooks.front_door_check`), and a refusal carries the REST answer's headers as trailing
metadata. Both tiers as real processes (the API as one uvicorn process)."""

from __future__ import annotations

import hashlib
import json
import secrets
from collections.abc import Iterator

import grpc
import pytest

from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from tests.support import Serving, free_port, http_ok, start_api

KEY = secrets.token_urlsafe(32)
METADATA_METHOD = "/inference.GRPCInferenceService/ModelMetadata"
#: One ModelMetadata call per client every 100 s: the second is refused.
RATE_LIMITS = {METADATA_METHOD: {"rate": 0.01, "burst": 1}}


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
        RATE_LIMITS__ROUTES=json.dumps(RATE_LIMITS),
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
    # The REST 401's WWW-Authenticate challenge (AUTH__REALM's default realm; RFC 6750's
    # error="invalid_token" for a key given but not valid).
    trailing = dict(refused.value.trailing_metadata() or ())
    challenge = 'Bearer realm="tfserve-split"'
    if metadata:
        challenge += ', error="invalid_token", error_description="unknown or revoked API key"'
    assert trailing["www-authenticate"] == challenge, trailing


def test_a_rate_limited_call_says_when_to_retry(grpc_target: str) -> None:
    with grpc.insecure_channel(grpc_target) as channel:
        stub = pb_grpc.GRPCInferenceServiceStub(channel)
        request = pb.ModelMetadataRequest(name="fraud")
        metadata = (("x-api-key", KEY),)
        assert stub.ModelMetadata(request, metadata=metadata, timeout=10).name == "fraud"
        with pytest.raises(grpc.RpcError) as limited:
            stub.ModelMetadata(request, metadata=metadata, timeout=10)
    assert limited.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    trailing = dict(limited.value.trailing_metadata() or ())
    # The REST 429's Retry-After: whole seconds until the bucket has a token (1 every 100 s).
    assert 1 <= int(trailing["retry-after"]) <= 100, trailing
    assert trailing["x-request-id"], trailing


@pytest.mark.parametrize("header", ["x-api-key", "authorization"])
def test_a_call_with_the_key_is_answered(grpc_target: str, header: str) -> None:
    value = KEY if header == "x-api-key" else f"Bearer {KEY}"
    reply = _infer(grpc_target, ((header, value),))
    assert [o.name for o in reply.outputs] == ["fraud_score"]
    assert 0.0 <= reply.outputs[0].contents.fp32_contents[0] <= 1.0
