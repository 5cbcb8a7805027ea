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

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from google.protobuf.message import Message

from api.security.front_door import FrontDoor, Refusal
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
    """A hook refuses the call: answered with `code` (a canonical code) and `message`, and
    `trailing` in the trailing metadata (lower-case keys: `www-authenticate`, `retry-after`)."""

    def __init__(self, code: Code, message: str, trailing: Sequence[tuple[str, str]] = ()) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.trailing = tuple(trailing)


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


def peer_address(peer: str) -> str | None:
    """The client's IP address from gRPC's peer ("ipv4:127.0.0.1:50412" -> "127.0.0.1",
    "ipv6:[::1]:50412" -> "::1"); None for another kind ("unix:/path")."""
    kind, _, rest = peer.partition(":")
    if kind in ("ipv4", "ipv6"):
        return rest.rsplit(":", 1)[0].strip("[]")
    return None


def front_door_check(front_door: FrontDoor) -> RpcHook:
    """The API's authentication and rate limits (`api.security.front_door.FrontDoor.check`, as
    the request middleware calls it) for every call: the method's full name as the path (e.g.
    "/inference.GRPCInferenceService/ModelInfer", which `AUTH__PUBLIC_PATHS`, `AUTH__SCOPES` and
    `RATE_LIMITS__ROUTES` may name), the metadata as headers (`x-api-key`, `authorization`), the
    peer's address as the client. A `Refusal` is answered with its gRPC code (UNAUTHENTICATED,
    PERMISSION_DENIED, RESOURCE_EXHAUSTED), its detail, and its REST headers as trailing
    metadata (`www-authenticate` as the 401's and 403's `WWW-Authenticate`, `retry-after` as the
    429's `Retry-After`, seconds)."""

    async def hook(call: RpcCall, proceed: RpcNext) -> Message:
        verdict = front_door.check(call.method, call.metadata.items(), peer_address(call.peer))
        if isinstance(verdict, Refusal):
            raise RpcRefused(verdict.grpc_code, verdict.detail, verdict.trailing_metadata())
        return await proceed()

    return hook
