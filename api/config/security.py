"""What a deployment configures of the front door: authentication (`AUTH__...`) and per-client
rate limits (`RATE_LIMITS__...`), nested in `api.config.settings.Settings`.

Both are off by default. `AUTH__ENABLED=true` turns authentication on, with at least one source
of credentials: a file of hashed API keys (`AUTH__API_KEYS_FILE`, e.g. a mounted Kubernetes
Secret) and/or JWT bearer tokens checked against a public key or a JWKS file
(`AUTH__JWT__PUBLIC_KEY_FILE` / `AUTH__JWT__JWKS_FILE`, with `AUTH__JWT__ISSUER` and
`AUTH__JWT__AUDIENCE`). A source configured while `AUTH__ENABLED` is false is refused at start:
an operator who wrote a key file meant the API to be closed. Rate limits are on as soon as one
rule is configured (`RATE_LIMITS__ROUTES`). The behaviour is `api.security`'s; the manual is
docs/security.md.

Maps and lists come from the environment as JSON (pydantic-settings' rule for nested values), e.g.

    AUTH__SCOPES='{"/v1/fraud/score": "fraud:score"}'
    RATE_LIMITS__ROUTES='{"/v1/fraud/score": {"rate": 50, "burst": 100}, "/*": {"rate": 200, "burst": 400}}'

Path patterns (public paths, scopes, rate-limit rules) are an exact path (`/v1/fraud/score`) or
a prefix ending in `*` (`/v2/models/*`, `/*` for every path); the longest pattern that matches
wins (`api.security.paths`). The gRPC front passes its full method name as the path
(`/inference.GRPCInferenceService/ModelInfer`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Final

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, field_validator, model_validator

# Signature algorithms a token may use: asymmetric only. An HMAC algorithm (HS256, ...) would
# make the verification key a shared secret, and allowing one beside a public key is the classic
# algorithm-confusion hole (a token "signed" with the public key as an HMAC secret); "none" is
# never allowed. RFC 7518 3.1 names them.
ALLOWED_ALGORITHMS: Final = frozenset(
    {"RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"}
)

# An HTTP field name (RFC 9110 5.1 token), in lower case as ASGI and gRPC metadata carry it.
_FIELD_NAME: Final = re.compile(r"[a-z0-9!#$%&'*+.^_`|~-]+")
_SCOPE: Final = re.compile(r"[\x21\x23-\x5b\x5d-\x7e]+")  # RFC 6749 3.3 scope-token

PathPattern = Annotated[str, StringConstraints(pattern=r"^/[^*]*\*?$", max_length=1024)]
"""An exact path (`/v1/fraud/score`) or a prefix ending in `*` (`/v2/models/*`, `/*`)."""


class JwtSettings(BaseModel):
    """JWT bearer tokens (RFC 7519), verified with PyJWT (the `auth` extra) against a public key
    or a JWKS file (`AUTH__JWT__<SETTING>`). Configured when either file is set."""

    model_config = ConfigDict(extra="forbid")

    public_key_file: Path | None = Field(
        default=None, description="PEM public key (RSA, EC or Ed25519) tokens are signed with."
    )
    jwks_file: Path | None = Field(
        default=None,
        description="JWKS file (RFC 7517 key set, e.g. the identity provider's jwks_uri document synced "
        "into a ConfigMap): the token's `kid` picks the key; re-read when it changes, like the API key file.",
    )
    issuer: str | None = Field(default=None, description="Required `iss` claim; required with a key.")
    audience: str | None = Field(default=None, description="Required `aud` claim (this API); required with a key.")
    algorithms: list[str] = Field(
        default_factory=lambda: ["RS256", "ES256", "EdDSA"],
        min_length=1,
        description="Signature algorithms accepted (asymmetric only: RS*, PS*, ES*, EdDSA).",
    )
    leeway_s: float = Field(
        default=30.0,
        ge=0.0,
        le=300.0,
        description="Clock skew tolerated on `exp`, `nbf` and `iat`, seconds.",
    )
    scope_claim: str = Field(
        default="scope",
        description="Claim holding the token's scopes: a space-separated string (RFC 8693 4.2) or a list "
        "(e.g. `scp`).",
    )
    subject_claim: str = Field(
        default="sub",
        description="Claim naming the client: its credential id (`jwt:<value>`) for logs and rate limits.",
    )

    @property
    def configured(self) -> bool:
        """A key source is set: tokens are accepted."""
        return self.public_key_file is not None or self.jwks_file is not None

    @field_validator("algorithms")
    @classmethod
    def _asymmetric_only(cls, value: list[str]) -> list[str]:
        refused = [a for a in value if a not in ALLOWED_ALGORITHMS]
        if refused:
            raise ValueError(f"{refused} not allowed; use asymmetric algorithms only: {sorted(ALLOWED_ALGORITHMS)}")
        return value

    @model_validator(mode="after")
    def _complete(self) -> JwtSettings:
        if self.public_key_file is not None and self.jwks_file is not None:
            raise ValueError("set AUTH__JWT__PUBLIC_KEY_FILE or AUTH__JWT__JWKS_FILE, not both")
        if self.configured and not (self.issuer and self.audience):
            raise ValueError("JWT needs AUTH__JWT__ISSUER and AUTH__JWT__AUDIENCE: tokens of any issuer or "
                             "audience would be accepted")
        return self


class AuthSettings(BaseModel):
    """Authentication of every request but the public paths (`AUTH__<SETTING>`), off by default."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = Field(
        default=False,
        description="Require a credential (API key or JWT) on every path but AUTH__PUBLIC_PATHS: missing or bad "
        "is 401, without the route's scope 403.",
    )
    api_keys_file: Path | None = Field(
        default=None,
        description="File of hashed API keys, one `<key id> sha256:<hex> [scope ...]` per line (a mounted "
        "Kubernetes Secret works: mount the volume, not a subPath); re-read when it changes, within "
        "AUTH__RELOAD_INTERVAL_S. Make lines with `python -m api.security.api_keys new`.",
    )
    api_key_header: Annotated[str, StringConstraints(pattern=_FIELD_NAME.pattern, to_lower=True)] = Field(
        default="x-api-key",
        description="Header (gRPC metadata key) an API key travels in; `Authorization: Bearer <key>` works too.",
    )
    jwt: JwtSettings = Field(default_factory=JwtSettings, description="JWT bearer tokens (AUTH__JWT__...).")
    public_paths: list[PathPattern] = Field(
        default_factory=lambda: ["/healthz", "/readyz"],
        description="Paths answered without a credential (probes); everything else needs one, /metrics and "
        "/docs included while they are on this port.",
    )
    scopes: dict[PathPattern, Annotated[str, StringConstraints(pattern=_SCOPE.pattern)]] = Field(
        default_factory=dict,
        description='Scope a credential must hold for a path pattern, e.g. {"/v1/fraud/score": "fraud:score"}; '
        "a path without a pattern needs a valid credential only.",
    )
    reload_interval_s: float = Field(
        default=5.0,
        gt=0.0,
        le=3600.0,
        description="The API key file and the JWKS file are checked for changes this often, seconds: a revoked "
        "key is refused at most this long after its line left the file (add the kubelet's Secret sync delay "
        "on Kubernetes).",
    )
    realm: str = Field(
        default="tfserve-split",
        pattern=r'^[^"\\\x00-\x1f]{1,64}$',
        description="`realm` of the WWW-Authenticate challenge (RFC 9110 11.6.1).",
    )

    @model_validator(mode="after")
    def _sources(self) -> AuthSettings:
        has_source = self.api_keys_file is not None or self.jwt.configured
        if self.enabled and not has_source:
            raise ValueError("AUTH__ENABLED=true needs a credential source: AUTH__API_KEYS_FILE and/or "
                             "AUTH__JWT__PUBLIC_KEY_FILE or AUTH__JWT__JWKS_FILE")
        if has_source and not self.enabled:
            raise ValueError("a credential source is set but AUTH__ENABLED is false, so the API would be open: "
                             "set AUTH__ENABLED=true (or remove the source)")
        return self


class RateLimit(BaseModel):
    """One token bucket: `rate` requests a second on average, up to `burst` at once."""

    model_config = ConfigDict(extra="forbid")

    rate: float = Field(gt=0.0, le=1e6, description="Tokens added per second (the sustained request rate).")
    burst: int = Field(ge=1, le=10**6, description="Bucket size: requests allowed at once after a quiet spell.")


class RateLimitSettings(BaseModel):
    """Per-client rate limits (`RATE_LIMITS__<SETTING>`): on when a rule is set."""

    model_config = ConfigDict(extra="forbid")

    routes: dict[PathPattern, RateLimit] = Field(
        default_factory=dict,
        description='Token bucket per client and path pattern, e.g. {"/v1/fraud/score": {"rate": 50, "burst": '
        "100}}; the client is the credential id, or the client address when the request carries none. Over "
        "it: 429 with Retry-After. Counted across every gunicorn worker.",
    )
    max_buckets: int = Field(
        default=65536,
        ge=64,
        le=1 << 22,
        description="Buckets held in shared memory (24 bytes each); when full, the bucket touched longest ago "
        "among a few candidates is reused.",
    )
