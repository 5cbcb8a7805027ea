"""The OIP gRPC server's hook: where authentication, rate limits and tracing plug into every call.

    front = OipFront(settings, hooks=[metadata_check(check_api_key), trace_rpc])

A hook is an interceptor around the rest of a call (`RpcHook`): it sees the call's method,
metadata and peer (`RpcCall`), may refuse it (`RpcRefused`, answered with its canonical code)
or time it, open a span around it or count it, and returns what `proceed()` returns. A check
written as a function of HTTP headers (lower-case names to values) takes gRPC's metadata as
it is (gRPC's keys are lower case too): `metadata_check` makes it a hook, in the composition
root (`api.app`), so a check written in a layer below the front (`api.request` for
authentication and rate limits, `api.observability` for tracing) needs nothing of it. No grpc
import here: hooks are built without loading grpc's server.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from google.protobuf.message import Message

from api.serving_client import Code


@dataclass(frozen=True, slots=True)
class RpcCall:
    """What a hook sees of a call.

    Attributes:
        method: the full method path, e.g. "/inference.GRPCInferenceService/ModelInfer".
        metadata: the invocation metadata, lower-case keys (gRPC's), text values only
            (`-bin` keys left out); a repeated key keeps its last value.
        peer: the client's address as gRPC gives it ("ipv4:127.0.0.1:50412").
    """

    method: str
    metadata: Mapping[str, str]
    peer: str


#: The rest of the call, as a hook calls it.
RpcNext = Callable[[], Awaitable[Message]]
#: A hook: runs around the rest of the call (check first and refuse, or time it, or add a
#: span), returning what `proceed()` returns.
RpcHook = Callable[[RpcCall, RpcNext], Awaitable[Message]]


class RpcRefused(Exception):
    """A hook refuses the call: answered with `code` (a canonical code) and `message`."""

    def __init__(self, code: Code, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


def metadata_check(check: Callable[[Mapping[str, str]], object], code: Code = Code.UNAUTHENTICATED) -> RpcHook:
    """A hook from a plain check of the call's metadata (an API-key or JWT check written for
    HTTP headers): `check(metadata)` raising any exception refuses the call with `code` and
    the exception's text; its return value is ignored."""

    async def hook(call: RpcCall, proceed: RpcNext) -> Message:
        try:
            check(call.metadata)
        except Exception as exc:
            raise RpcRefused(code, str(exc) or code.name) from exc
        return await proceed()

    return hook
