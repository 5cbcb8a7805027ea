"""Authentication over real processes: the API (uvicorn, as `api_command` starts it) with API
keys and JWT on, in front of fake serving. Every answer's status, headers and body for each
credential kind; a revoked key refused within the reload interval; no key or token in the
API's logs or its score events."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.api.stack import Api, FakeServing, start_api_process, start_fake, transactions
from tests.api.tokens import Issuer, KeyFile, auth_env
from tests.support import wait_until

RELOAD_S = 1.0
SCORE = "/v1/fraud/score"
SCOPES = {SCORE: "fraud:score", "/v1/digits/*": "digits:classify"}


@dataclass
class Stack:
    api: Api
    keys: KeyFile
    issuer: Issuer
    events: Path
    sent: list[str]  # every key and token sent, for the leak check

    def post(self, path: str = SCORE, **headers: str) -> httpx.Response:
        for value in headers.values():
            self.sent.append(value.removeprefix("Bearer "))
        return httpx.post(self.api.url + path, json=transactions(1)[0], headers=_headers(headers), timeout=10)

    def get(self, path: str, **headers: str) -> httpx.Response:
        return httpx.get(self.api.url + path, headers=_headers(headers), timeout=10)


def _headers(headers: dict[str, str]) -> dict[str, str]:
    return {k.replace("_", "-"): v for k, v in headers.items()}


@pytest.fixture(scope="module")
def fake(tmp_path_factory: pytest.TempPathFactory) -> Iterator[FakeServing]:
    fake = start_fake(tmp_path_factory.mktemp("fake"), "fake")
    yield fake
    fake.proc.stop()


@pytest.fixture(scope="module")
def stack(fake: FakeServing, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("auth")
    keys, issuer = KeyFile(tmp / "api-keys"), Issuer.rsa(tmp)
    events = tmp / "api-events.jsonl"
    env = auth_env(keys=keys, issuer=issuer, scopes=SCOPES, reload_s=RELOAD_S)
    # The access log on: it is one of the places a key must never show up in.
    api = start_api_process(tmp, "api", fake.url, ACCESS_LOG="true", EVENTS_JSONL_PATH=str(events), **env)
    yield Stack(api, keys, issuer, events, [])
    api.proc.stop()


def assert_error(response: httpx.Response, status: int, code: str) -> dict[str, object]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/json"
    body = response.json()
    assert set(body) == {"detail", "code", "request_id"} and body["code"] == code
    assert body["request_id"] == response.headers["x-request-id"]
    return body  # type: ignore[no-any-return]


def test_probes_are_public_everything_else_needs_a_credential(stack: Stack) -> None:
    assert stack.get("/healthz").status_code == 200
    assert stack.get("/readyz").status_code == 200
    for path in ("/metrics", "/docs", "/openapi.json", "/no-such-path"):
        response = stack.get(path)
        assert_error(response, 401, "unauthenticated")
        assert response.headers["www-authenticate"] == 'Bearer realm="tfserve-split"'
    body = assert_error(stack.post(), 401, "unauthenticated")
    assert body["detail"] == (
        "missing credential: send an API key (X-API-Key or Authorization: Bearer) or a JWT (Authorization: Bearer)"
    )


def test_api_keys_401_403_200(stack: Stack) -> None:
    scorer = stack.keys.add("scorer", "fraud:score")
    other = stack.keys.add("digits-only", "digits:classify")
    stack.keys.add("unused")
    ok = wait_for_status(stack, 200, x_api_key=scorer)
    assert ok.json()["model"]["name"] == "fraud"
    assert stack.post(authorization=f"Bearer {scorer}").status_code == 200
    refused = stack.post(x_api_key=other)
    body = assert_error(refused, 403, "insufficient_scope")
    assert body["detail"] == "the credential lacks the scope 'fraud:score' that /v1/fraud/score requires"
    assert refused.headers["www-authenticate"] == (
        'Bearer realm="tfserve-split", error="insufficient_scope", scope="fraud:score"'
    )
    bad = stack.post(x_api_key="tfs_" + "x" * 43)
    assert assert_error(bad, 401, "unauthenticated")["detail"] == "invalid API key"
    assert bad.headers["www-authenticate"] == (
        'Bearer realm="tfserve-split", error="invalid_token", error_description="unknown or revoked API key"'
    )
    assert stack.get("/metrics", x_api_key=scorer).status_code == 200  # on this port, behind a credential


def test_jwt_401_403_200(stack: Stack) -> None:
    token = stack.issuer.token(sub="svc-scorer", scope="fraud:score other")
    stack.sent.append(token)
    assert stack.post(authorization=f"Bearer {token}").status_code == 200
    for claims, description in (
        ({"lifetime_s": -120}, "token expired"),
        ({"aud": "another-api"}, "wrong audience"),
        ({"iss": "https://evil.example/"}, "wrong issuer"),
    ):
        response = stack.post(authorization=f"Bearer {stack.issuer.token(**claims)}")  # type: ignore[arg-type]
        assert assert_error(response, 401, "unauthenticated")["detail"] == f"invalid bearer token: {description}"
        assert response.headers["www-authenticate"] == (
            f'Bearer realm="tfserve-split", error="invalid_token", error_description="{description}"'
        )
    unscoped = stack.post(authorization=f"Bearer {stack.issuer.token(scope='digits:classify')}")
    assert_error(unscoped, 403, "insufficient_scope")


def test_a_revoked_key_is_refused_within_the_reload_interval(stack: Stack) -> None:
    doomed = stack.keys.add("doomed", "fraud:score")
    kept = stack.keys.add("kept", "fraud:score")
    wait_for_status(stack, 200, x_api_key=doomed)
    stack.keys.revoke("doomed")
    revoked_at = time.monotonic()
    refused = wait_for_status(stack, 401, x_api_key=doomed)
    elapsed = time.monotonic() - revoked_at
    assert refused.json()["detail"] == "invalid API key"
    # Refused at the first request after the interval: the bound plus one request's time.
    assert elapsed <= RELOAD_S + 1.0, elapsed
    assert stack.post(x_api_key=kept).status_code == 200


def test_keys_and_tokens_never_reach_logs_events_or_bodies(stack: Stack) -> None:
    # Runs after the others in this module: everything they sent is in `stack.sent`.
    key = stack.keys.add("last", "fraud:score")
    wait_for_status(stack, 200, x_api_key=key)
    stack.post(x_api_key=key + "tampered")
    # Score events are written in the background, a batch at a time.
    wait_until(lambda: stack.events.exists() and stack.events.read_text().count("\n") >= 5, 10, "score events")
    log = stack.api.proc.log(None)
    events = stack.events.read_text()
    assert '"credential":"key:scorer"' in log and '"credential":"jwt:svc-scorer"' in log  # the ids are there
    secrets = [s for s in stack.sent if len(s) >= 32]
    assert len(secrets) >= 8
    for secret in secrets:
        for place, text in (("log", log), ("events", events)):
            assert secret not in text, f"a credential in the {place}"
            assert secret[8:40] not in text, f"part of a credential in the {place}"


def wait_for_status(stack: Stack, status: int, timeout_s: float = 10.0, **headers: str) -> httpx.Response:
    """POST the score until it answers `status` (the key file is re-read once RELOAD_S is over)."""
    deadline = time.monotonic() + timeout_s
    while True:
        response = stack.post(**headers)
        if response.status_code == status or time.monotonic() > deadline:
            assert response.status_code == status, response.text
            return response
        time.sleep(0.02)
