"""The front door: who may call (API keys, JWT, scopes) and how often (rate limits), as one
plain function of (path, headers or metadata, client address).

    door = FrontDoor.from_settings(settings.auth, settings.rate_limits)   # None: both off
    verdict = door.check("/v1/fraud/score", scope["headers"], "10.0.0.7")
    # None: go on, anonymously; Principal: go on as this client; Refusal: answer it

`api.request.middleware.RequestMiddleware` calls it for every HTTP request before any other
admission rule, and a gRPC front calls the same `check` from its interceptor with the method's
full name and the invocation metadata, answering a `Refusal` with `Refusal.grpc_code` and
`Refusal.trailing_metadata()`.

In order:

1. A public path (`AUTH__PUBLIC_PATHS`, the probes by default) needs no credential; with
   authentication off every path is public.
2. Otherwise the request must carry one accepted credential (`api.security.credentials`): an
   API key of the key file (`api.security.api_keys`) or a JWT that verifies
   (`api.security.jwt_tokens`). Missing, unknown, revoked, expired or malformed: 401
   `unauthenticated` with `WWW-Authenticate: Bearer realm="..."` (RFC 6750 3; `error="invalid_token"`
   and a fixed `error_description` when one was sent).
3. The path's scope (`AUTH__SCOPES`, longest pattern) must be among the credential's: else
   403 `insufficient_scope`, `WWW-Authenticate: Bearer ..., error="insufficient_scope",
   scope="..."` (RFC 6750 3.1).
4. The path's rate limit (`RATE_LIMITS__ROUTES`), counted for the credential id or, without one,
   the client address (`api.security.rate_limit`): over it, 429 `rate_limited` with `Retry-After`
   (whole seconds until a token is back).

No answer, log line or exception here ever holds a key or a token: details are fixed texts, and
a client is named by its credential id (`key:<id>`, `jwt:<subject>`) only.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Final

from api.config.security import AuthSettings, RateLimitSettings
from api.security.api_keys import ApiKeys
from api.security.credentials import Header, TokenRefused, presented
from api.security.paths import PathTable
from api.security.rate_limit import RateLimiter
from canonical_codes import Code

if TYPE_CHECKING:
    from api.security.jwt_tokens import JwtVerifier

MAX_SUBJECT_CHARS: Final = 128  # of a JWT subject, in a credential id


class SecurityConfigError(ValueError):
    """The front door cannot start as configured (a key file missing or malformed, the `auth`
    extra not installed for JWT); the message names the setting, never a key."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The client a request was accepted for.

    Attributes:
        credential_id: `key:<key id>` or `jwt:<subject>` (the subject cut to 128 characters):
            what the access log and the rate limits know the client by.
        scopes: the credential's scopes.
    """

    credential_id: str
    scopes: frozenset[str]


@dataclass(frozen=True, slots=True)
class Refusal:
    """A request the front door answers itself, in the API's error shape.

    Attributes:
        status: 401, 403 or 429.
        code: `unauthenticated`, `insufficient_scope` or `rate_limited` (the body's `code`).
        detail: the body's `detail`: a fixed text, never a credential.
        headers: `WWW-Authenticate` (401, 403) or `Retry-After` (429).
        credential_id: the client, when a credential was accepted (403, 429).
    """

    status: int
    code: str
    detail: str
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))
    credential_id: str | None = None

    @property
    def grpc_code(self) -> Code:
        """The gRPC status of the same refusal: UNAUTHENTICATED, PERMISSION_DENIED or RESOURCE_EXHAUSTED."""
        return _GRPC_CODES[self.status]

    def trailing_metadata(self) -> tuple[tuple[str, str], ...]:
        """The headers as gRPC trailing metadata (lower-case keys)."""
        return tuple((name.lower(), value) for name, value in self.headers.items())


_GRPC_CODES: Final = {401: Code.UNAUTHENTICATED, 403: Code.PERMISSION_DENIED, 429: Code.RESOURCE_EXHAUSTED}


class FrontDoor:
    """Authentication and rate limits for one app (see module doc); made once per app, before
    gunicorn forks its workers (the rate-limit buckets are shared memory).

    Args:
        auth: `AUTH__...`.
        rate_limits: `RATE_LIMITS__...`.

    Raises:
        SecurityConfigError: a credential source cannot be loaded.
    """

    def __init__(self, auth: AuthSettings, rate_limits: RateLimitSettings) -> None:
        self.auth_enabled = auth.enabled
        self._public = PathTable.of(auth.public_paths)
        self._scopes = PathTable(auth.scopes)
        self._key_header = auth.api_key_header
        self._realm = auth.realm
        self._challenge = {"WWW-Authenticate": f'Bearer realm="{auth.realm}"'}
        self.api_keys: ApiKeys | None = None
        self.jwt: JwtVerifier | None = None
        if auth.enabled and auth.api_keys_file is not None:
            try:
                self.api_keys = ApiKeys(auth.api_keys_file, auth.reload_interval_s)
            except ValueError as exc:
                raise SecurityConfigError(str(exc)) from None
        if auth.enabled and auth.jwt.configured:
            self.jwt = _jwt_verifier(auth)
        self.rate_limiter = RateLimiter(rate_limits) if rate_limits.routes else None
        kinds = [k for k, on in (("an API key (X-API-Key or Authorization: Bearer)", self.api_keys),
                                 ("a JWT (Authorization: Bearer)", self.jwt)) if on is not None]  # fmt: skip
        self._accepted = " or ".join(kinds)

    @classmethod
    def from_settings(cls, auth: AuthSettings, rate_limits: RateLimitSettings) -> FrontDoor | None:
        """The front door the settings describe, or None when authentication and rate limits
        are both off (the middleware then skips it: no cost at all).

        Raises:
            SecurityConfigError: a credential source cannot be loaded.
        """
        if not auth.enabled and not rate_limits.routes:
            return None
        return cls(auth, rate_limits)

    def check(self, path: str, headers: Iterable[Header], client: str | None) -> Principal | Refusal | None:
        """Admit or refuse one request (see module doc).

        Args:
            path: the request path as routed (ASGI `scope["path"]`), or a gRPC method's full name.
            headers: the request's headers or gRPC metadata: (lower-case name, value) pairs,
                bytes or str.
            client: the client's address, for rate limits without a credential; None when unknown.

        Returns:
            None to go on without a credential (a public path, or authentication off), the
            `Principal` to go on as, or the `Refusal` to answer.
        """
        principal: Principal | None = None
        if self.auth_enabled and self._public.match(path) is None:
            found = self._authenticate(headers)
            if isinstance(found, Refusal):
                return found
            principal = found
            rule = self._scopes.match(path)
            if rule is not None and rule[1] not in principal.scopes:
                pattern, scope = rule
                return Refusal(
                    403,
                    "insufficient_scope",
                    f"the credential lacks the scope {scope!r} that {pattern} requires",
                    {"WWW-Authenticate": f'Bearer realm="{self._realm}", error="insufficient_scope", scope="{scope}"'},
                    principal.credential_id,
                )
        if self.rate_limiter is not None:
            who = principal.credential_id if principal is not None else f"addr:{client or '-'}"
            limited = self.rate_limiter.check(path, who)
            if limited is not None:
                limit = limited.limit
                return Refusal(
                    429,
                    "rate_limited",
                    f"rate limit of {limit.rate:g} requests/s (burst {limit.burst}) on {limited.pattern} "
                    f"exceeded; retry after {limited.retry_after_s} s",
                    {"Retry-After": str(limited.retry_after_s)},
                    principal.credential_id if principal is not None else None,
                )
        return principal

    def _authenticate(self, headers: Iterable[Header]) -> Principal | Refusal:
        sent = presented(headers, self._key_header)
        if sent.problem is not None:
            return self._unauthenticated(f"{sent.problem}; send {self._accepted}", "invalid_request")
        if sent.token is None:
            return self._unauthenticated(f"missing credential: send {self._accepted}", None)
        if sent.kind == "jwt":
            if self.jwt is None:
                return self._unauthenticated("bearer tokens (JWT) are not accepted here", "invalid_token")
            try:
                claims = self.jwt.verify(sent.token)
            except TokenRefused as exc:
                return self._unauthenticated(f"invalid bearer token: {exc.description}", "invalid_token",
                                             exc.description)  # fmt: skip
            return Principal(f"jwt:{claims.subject[:MAX_SUBJECT_CHARS]}", claims.scopes)
        if self.api_keys is None:
            return self._unauthenticated("API keys are not accepted here", "invalid_token")
        entry = self.api_keys.lookup(sent.token)
        if entry is None:
            return self._unauthenticated("invalid API key", "invalid_token", "unknown or revoked API key")
        return Principal(f"key:{entry.key_id}", entry.scopes)

    def _unauthenticated(self, detail: str, error: str | None, description: str | None = None) -> Refusal:
        if error is None:
            return Refusal(401, "unauthenticated", detail, self._challenge)
        challenge = f'Bearer realm="{self._realm}", error="{error}"'
        if description is not None:
            challenge += f', error_description="{description}"'
        return Refusal(401, "unauthenticated", detail, {"WWW-Authenticate": challenge})


def _jwt_verifier(auth: AuthSettings) -> JwtVerifier:
    """The verifier, imported only here: PyJWT is the optional `auth` extra."""
    try:
        from api.security.jwt_tokens import JwtVerifier
    except ImportError as exc:
        raise SecurityConfigError(
            f"AUTH__JWT__... needs PyJWT and cryptography: pip install 'tfserve-split[auth]' ({exc.name} is missing)"
        ) from None
    try:
        return JwtVerifier(auth.jwt, auth.reload_interval_s)
    except ValueError as exc:
        raise SecurityConfigError(str(exc)) from None
