"""The OIP gRPC server's hook (`api.oip.hooks`), over a real gRPC connection: where authentication,
rate limits and tracing plug in. ServerMetadata needs no serving tier, so the server runs here
in-process with the real call path (`api.oip.grpc_server.serve_grpc`) and no serving client."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping

import grpc
import pytest
from google.protobuf.message import Message

from api.config.oip import Exposure, OipSettings
from api.observability.logging_config import AccessLog
from api.observability.metrics import ApiMetrics
from api.oip.catalog import Catalog
from api.oip.grpc_server import serve_grpc
from api.oip.hooks import RpcCall, RpcNext, metadata_check
from api.oip.inference import Inference
from api.oip.service import OipService
from api.protos.inference import open_inference_grpc_pb2 as pb
from api.protos.inference import open_inference_grpc_pb2_grpc as pb_grpc
from api.request.admission.in_flight import InFlightBoard

METADATA = "/inference.GRPCInferenceService/ServerMetadata"


def require_key(headers: Mapping[str, str]) -> None:
    """A check written for HTTP headers: an API key."""
    if headers.get("x-api-key") != "s3cret":
        raise PermissionError("missing or wrong x-api-key")


async def _scenario() -> tuple[list[str], list[tuple[grpc.StatusCode, str]], str, list[str]]:
    seen: list[str] = []

    async def record(call: RpcCall, proceed: RpcNext) -> Message:
        seen.append(f"{call.method} key={call.metadata.get('x-api-key', '-')}")
        return await proceed()

    catalog = Catalog(None, Exposure(every=True), ttl_s=1.0, max_entries=4)  # type: ignore[arg-type]
    service = OipService(Inference(catalog), server_name="hooked", server_version="0", ready_models=())
    settings = OipSettings(models="all", grpc_port=0, grpc_host="127.0.0.1")
    failures: list[tuple[grpc.StatusCode, str]] = []
    async with serve_grpc(
        service,
        settings,
        request_timeout_s=5.0,
        in_flight=InFlightBoard(per_worker=4),
        metrics=ApiMetrics(),
        access_log=AccessLog(enabled=False),
        hooks=[record, metadata_check(require_key)],
    ) as port:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for metadata in ((), (("x-api-key", "wrong"),)):
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    await stub.ServerMetadata(pb.ServerMetadataRequest(), metadata=metadata, timeout=10)
                failures.append((refused.value.code(), refused.value.details() or ""))
            call = stub.ServerMetadata(
                pb.ServerMetadataRequest(), metadata=(("x-api-key", "s3cret"), ("x-request-id", "rid-1")), timeout=10
            )
            answer = await call
            trailing = [value for key, value in (await call.trailing_metadata() or ()) if key == "x-request-id"]
    return seen, failures, answer.name, trailing


def test_hooks_run_in_order_and_a_metadata_check_refuses_with_its_code() -> None:
    seen, failures, name, request_ids = asyncio.run(_scenario())
    # The first hook saw every call, the check behind it refused two with UNAUTHENTICATED.
    assert seen == [f"{METADATA} key=-", f"{METADATA} key=wrong", f"{METADATA} key=s3cret"]
    assert [code for code, _ in failures] == [grpc.StatusCode.UNAUTHENTICATED] * 2
    assert all("x-api-key" in details for _, details in failures), failures
    assert name == "hooked" and request_ids == ["rid-1"]
