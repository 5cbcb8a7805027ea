"""api.security.front_door: `FrontDoor.check` as a plain function of (path, headers or gRPC
metadata, client address), its answers, the settings it starts from, and a real gRPC server
whose interceptor calls it."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import grpc
import pytest
from pydantic import ValidationError

from api.config.security import AuthSettings, RateLimitSettings
from api.config.settings import Settings
from api.security.front_door import FrontDoor, Principal, Refusal, SecurityConfigError
from canonical_codes import Code
from tests.api.tokens import AUDIENCE, ISSUER, Issuer, KeyFile
from tests.support import free_port


def door(tmp_path: Path, *, scopes: dict[str, str] | None = None, routes: dict[str, Any] | None = None,
         jwt: bool = True, keys: bool = True, enabled: bool = True) -> tuple[FrontDoor, KeyFile, Issuer]:  # fmt: skip
    tmp_path.mkdir(parents=True, exist_ok=True)
    file, issuer = KeyFile(tmp_path / "keys"), Issuer.rsa(tmp_path)
    # Reloaded at every check: keys added after the door is made are seen at once.
    auth: dict[str, Any] = {"enabled": enabled, "scopes": scopes or {}, "reload_interval_s": 1e-6}
    if keys and enabled:
        auth["api_keys_file"] = file.path
    if jwt and enabled:
        auth["jwt"] = {"jwks_file": issuer.jwks_path, "issuer": ISSUER, "audience": AUDIENCE}
    built = FrontDoor.from_settings(
        AuthSettings.model_validate(auth), RateLimitSettings.model_validate({"routes": routes or {}})
    )
    assert built is not None
    return built, file, issuer


def asgi(**headers: str) -> list[tuple[bytes, bytes]]:
    return [(k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()]


def test_off_by_default_and_nothing_to_ask() -> None:
    settings = Settings()
    assert settings.auth.enabled is False and not settings.rate_limits.routes
    assert FrontDoor.from_settings(settings.auth, settings.rate_limits) is None


def test_public_paths_need_nothing_everything_else_a_credential(tmp_path: Path) -> None:
    front, keys, _ = door(tmp_path)
    for path in ("/healthz", "/readyz"):
        assert front.check(path, [], "10.0.0.1") is None
    for path in ("/v1/fraud/score", "/metrics", "/docs", "/openapi.json", "/no-such-path", "/healthz/"):
        refusal = front.check(path, [], "10.0.0.1")
        assert isinstance(refusal, Refusal) and refusal.status == 401, path
        assert refusal.code == "unauthenticated"
        assert refusal.headers == {"WWW-Authenticate": 'Bearer realm="tfserve-split"'}
        assert "X-API-Key" in refusal.detail and "JWT" in refusal.detail


def test_an_api_key_in_either_place(tmp_path: Path) -> None:
    front, keys, _ = door(tmp_path)
    key = keys.add("ci", "fraud:score")
    by_header = front.check("/v1/fraud/score", asgi(x_api_key=key), None)
    by_bearer = front.check("/v1/fraud/score", asgi(authorization=f"Bearer {key}"), None)
    assert by_header == by_bearer == Principal("key:ci", frozenset({"fraud:score"}))


def test_a_jwt_bearer_token(tmp_path: Path) -> None:
    front, _, issuer = door(tmp_path)
    token = issuer.token(sub="svc-a", scope="fraud:score")
    assert front.check("/v1/fraud/score", asgi(authorization=f"bearer {token}"), None) == Principal(
        "jwt:svc-a", frozenset({"fraud:score"})
    )


UNKNOWN_KEY = 'error="invalid_token", error_description="unknown or revoked API key"'


@pytest.mark.parametrize(
    ("headers", "detail", "challenge"),
    [
        ({"x_api_key": "tfs_" + "A" * 43}, "invalid API key", UNKNOWN_KEY),
        ({"authorization": "Basic dXNlcjpwYXNz"}, "unsupported authorization scheme", 'error="invalid_request"'),
        ({"x_api_key": "has spaces and more than thirty-two chars"}, "malformed credential", 'error="invalid_request"'),
        ({"authorization": "Bearer a.b.c"}, "invalid bearer token: malformed token", "malformed token"),
    ],
)
def test_bad_credentials_are_401_with_a_fixed_description(
    tmp_path: Path, headers: dict[str, str], detail: str, challenge: str
) -> None:
    front, _, _ = door(tmp_path)
    refusal = front.check("/v1/fraud/score", asgi(**headers), None)
    assert isinstance(refusal, Refusal) and refusal.status == 401 and refusal.code == "unauthenticated"
    assert detail in refusal.detail
    assert refusal.headers["WWW-Authenticate"].startswith('Bearer realm="tfserve-split", ')
    assert challenge in refusal.headers["WWW-Authenticate"]
    for value in headers.values():
        assert value not in refusal.detail and value not in refusal.headers["WWW-Authenticate"]


def test_two_credentials_are_ambiguous(tmp_path: Path) -> None:
    front, keys, issuer = door(tmp_path)
    key = keys.add("ci")
    refusal = front.check("/x", [(b"x-api-key", key.encode()), (b"authorization", f"Bearer {key}".encode())], None)
    assert isinstance(refusal, Refusal) and refusal.status == 401 and "more than one credential" in refusal.detail


def test_a_kind_that_is_not_configured_is_refused(tmp_path: Path) -> None:
    only_keys, _, issuer = door(tmp_path / "a", jwt=False)
    refusal = only_keys.check("/x", asgi(authorization=f"Bearer {issuer.token()}"), None)
    assert isinstance(refusal, Refusal) and refusal.detail == "bearer tokens (JWT) are not accepted here"
    only_jwt, keys, _ = door(tmp_path / "b", keys=False)
    refusal = only_jwt.check("/x", asgi(x_api_key=keys.add("ci")), None)
    assert isinstance(refusal, Refusal) and refusal.detail == "API keys are not accepted here"


def test_a_missing_scope_is_403_naming_it(tmp_path: Path) -> None:
    front, keys, issuer = door(tmp_path, scopes={"/v1/fraud/score": "fraud:score", "/v1/*": "v1"})
    key = keys.add("ci", "v1")
    for headers in (asgi(x_api_key=key), asgi(authorization=f"Bearer {issuer.token(sub='svc', scope='v1')}")):
        assert isinstance(front.check("/v1/digits/classify", headers, None), Principal)
        refusal = front.check("/v1/fraud/score", headers, None)
        assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (403, "insufficient_scope")
        assert refusal.detail == "the credential lacks the scope 'fraud:score' that /v1/fraud/score requires"
        assert refusal.headers["WWW-Authenticate"] == (
            'Bearer realm="tfserve-split", error="insufficient_scope", scope="fraud:score"'
        )
        assert refusal.credential_id in {"key:ci", "jwt:svc"}


def test_rate_limits_count_the_credential_or_the_address(tmp_path: Path) -> None:
    routes = {"/v1/fraud/score": {"rate": 0.001, "burst": 2}}
    front, keys, _ = door(tmp_path, routes=routes)
    a, b = asgi(x_api_key=keys.add("a")), asgi(x_api_key=keys.add("b"))
    assert [isinstance(front.check("/v1/fraud/score", a, "10.0.0.1"), Principal) for _ in range(2)] == [True, True]
    refusal = front.check("/v1/fraud/score", a, "10.0.0.2")  # another address: the same credential
    assert isinstance(refusal, Refusal) and (refusal.status, refusal.code) == (429, "rate_limited")
    assert refusal.headers == {"Retry-After": "1000"} and refusal.credential_id == "key:a"
    assert refusal.detail == "rate limit of 0.001 requests/s (burst 2) on /v1/fraud/score exceeded; retry after 1000 s"
    assert isinstance(front.check("/v1/fraud/score", b, "10.0.0.1"), Principal)
    anonymous, _, _ = door(tmp_path / "off", enabled=False, routes=routes)
    assert [anonymous.check("/v1/fraud/score", [], "10.0.0.1") for _ in range(2)] == [None, None]
    assert isinstance(anonymous.check("/v1/fraud/score", [], "10.0.0.1"), Refusal)
    assert anonymous.check("/v1/fraud/score", [], "10.0.0.2") is None


def test_a_rule_on_a_public_path_counts_the_address(tmp_path: Path) -> None:
    front, keys, _ = door(tmp_path, routes={"/healthz": {"rate": 0.001, "burst": 1}})
    assert front.check("/healthz", [], "10.0.0.1") is None
    assert isinstance(front.check("/healthz", asgi(x_api_key=keys.add("a")), "10.0.0.1"), Refusal)  # not the key's
    assert front.check("/healthz", [], "10.0.0.2") is None


def test_unauthenticated_requests_take_no_token(tmp_path: Path) -> None:
    front, keys, _ = door(tmp_path, routes={"/*": {"rate": 0.001, "burst": 1}})
    for _ in range(5):
        assert isinstance(front.check("/v1/fraud/score", [], "10.0.0.1"), Refusal)
    assert isinstance(front.check("/v1/fraud/score", asgi(x_api_key=keys.add("a")), "10.0.0.1"), Principal)


def test_grpc_metadata_works_as_headers(tmp_path: Path) -> None:
    front, keys, issuer = door(tmp_path)
    key = keys.add("ci")
    method = "/inference.GRPCInferenceService/ModelInfer"
    assert front.check(method, (("x-api-key", key), ("user-agent", "grpc-python")), "ipv4:127.0.0.1:5000") == (
        Principal("key:ci", frozenset())
    )
    assert isinstance(front.check(method, (("authorization", f"Bearer {issuer.token()}"),), None), Principal)
    refusal = front.check(method, (("x-trace-bin", b"\x00\x01"),), None)
    assert isinstance(refusal, Refusal) and refusal.grpc_code is Code.UNAUTHENTICATED
    assert refusal.trailing_metadata() == (("www-authenticate", 'Bearer realm="tfserve-split"'),)


def test_settings_refuse_a_half_configured_front_door(tmp_path: Path) -> None:
    with pytest.raises(ValidationError, match="needs a credential source"):
        AuthSettings(enabled=True)
    with pytest.raises(ValidationError, match="AUTH__ENABLED is false"):
        AuthSettings(api_keys_file=tmp_path / "keys")
    with pytest.raises(ValidationError, match="path pattern|String should match"):
        AuthSettings.model_validate({"enabled": True, "api_keys_file": "k", "public_paths": ["healthz"]})
    with pytest.raises(ValidationError):
        RateLimitSettings.model_validate({"routes": {"/x": {"rate": 0, "burst": 1}}})


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AUTH__ENABLED", "true")
    monkeypatch.setenv("AUTH__API_KEYS_FILE", str(tmp_path / "keys"))
    monkeypatch.setenv("AUTH__SCOPES", '{"/v1/fraud/score": "fraud:score"}')
    monkeypatch.setenv("AUTH__PUBLIC_PATHS", '["/healthz", "/readyz", "/docs"]')
    monkeypatch.setenv("RATE_LIMITS__ROUTES", '{"/v1/*": {"rate": 5, "burst": 10}}')
    settings = Settings()
    assert settings.auth.scopes == {"/v1/fraud/score": "fraud:score"}
    assert settings.auth.public_paths == ["/healthz", "/readyz", "/docs"]
    assert settings.rate_limits.routes["/v1/*"].burst == 10


def test_a_missing_key_file_stops_the_start(tmp_path: Path) -> None:
    auth = AuthSettings(enabled=True, api_keys_file=tmp_path / "missing")
    with pytest.raises(SecurityConfigError, match="AUTH__API_KEYS_FILE"):
        FrontDoor(auth, RateLimitSettings())


# --- from a gRPC server's interceptor --------------------------------------------------------


class FrontDoorInterceptor(grpc.aio.ServerInterceptor):
    """What a gRPC front does with the check: refuse with its code and trailing metadata."""

    def __init__(self, front: FrontDoor) -> None:
        self.front = front

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        verdict = self.front.check(details.method, details.invocation_metadata or (), None)
        if not isinstance(verdict, Refusal):
            return await continuation(details)

        async def refuse(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
            context.set_trailing_metadata(verdict.trailing_metadata())
            await context.abort(grpc.StatusCode[verdict.grpc_code.name], verdict.detail)
            raise AssertionError("abort returns never")

        return grpc.unary_unary_rpc_method_handler(refuse)


def test_a_grpc_interceptor_refuses_and_admits_with_the_same_check(tmp_path: Path) -> None:
    front, keys, _ = door(tmp_path, routes={"/test.Echo/*": {"rate": 0.001, "burst": 1}})
    key = keys.add("ci")

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def main() -> None:
        server = grpc.aio.server(interceptors=[FrontDoorInterceptor(front)])
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("test.Echo", {"Call": grpc.unary_unary_rpc_method_handler(echo)})]
        )
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        try:
            async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary("/test.Echo/Call")
                with pytest.raises(grpc.aio.AioRpcError) as missing:
                    await call(b"hi")
                assert missing.value.code() is grpc.StatusCode.UNAUTHENTICATED
                assert dict(missing.value.trailing_metadata())["www-authenticate"] == 'Bearer realm="tfserve-split"'
                assert await call(b"hi", metadata=(("x-api-key", key),)) == b"hi"
                with pytest.raises(grpc.aio.AioRpcError) as limited:
                    await call(b"hi", metadata=(("x-api-key", key),))
                assert limited.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED
                assert dict(limited.value.trailing_metadata())["retry-after"] == "1000"
        finally:
            await server.stop(None)

    asyncio.run(main())
