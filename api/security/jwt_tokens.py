"""JWT bearer tokens (RFC 7519), verified with PyJWT against a public key or a JWKS file.

A token is accepted when its signature verifies with the configured key (or, from a JWKS,
the key its `kid` names; with no `kid`, the set's only key), under an algorithm both allowed
(`AUTH__JWT__ALGORITHMS`, asymmetric only) and of that key's family (RSA: RS*/PS*, EC: the
curve's ES*, Ed25519/Ed448: EdDSA; a JWK's own `alg`, when it has one, alone), and when it has
`exp`, `iss` equal to `AUTH__JWT__ISSUER`, `aud` containing `AUTH__JWT__AUDIENCE` and the
subject claim, each time claim (`exp`, `nbf`, `iat`) within `AUTH__JWT__LEEWAY_S` of this host's
clock (RFC 7519 4.1, RFC 8725 3.1-3.3, 3.8-3.9). Its scopes are the scope claim's: a
space-separated string (RFC 8693 4.2, `scope`) or a list of strings (`scp`).

Every refusal is a `TokenRefused` with a fixed description (never the token, never PyJWT's text,
which can quote the token's decoded parts).

A verified token is remembered (by its SHA-256, not its text) until it expires, so a client
that sends the same token for its lifetime pays the signature check once: a request with a
token never seen cost 106 microseconds of CPU here (RS256, 2048-bit key), one with a cached token
about 5 (`python -m bench.front_door`, 2 busy cores). The cache
is bounded (`CACHE_SIZE`, oldest out first) and emptied when the JWKS file changes, so a key
removed from the set refuses its tokens within `AUTH__RELOAD_INTERVAL_S`.

PyJWT and `cryptography` are the `auth` extra (`pip install 'tfserve-split[auth]'`); only this
module imports them, and only when JWT is configured.
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

import jwt
from cryptography.hazmat.primitives.asymmetric import ec, ed448, ed25519, rsa
from cryptography.hazmat.primitives.serialization import load_pem_public_key

from api.config.security import JwtSettings
from api.security.credentials import TokenRefused
from api.security.file_watch import FileWatch

logger = logging.getLogger("api.security")

CACHE_SIZE: Final = 4096  # verified tokens remembered per worker (about 200 bytes each)
_EC_ALGORITHMS: Final = {"secp256r1": "ES256", "secp384r1": "ES384", "secp521r1": "ES512"}


@dataclass(frozen=True, slots=True)
class TokenClaims:
    """What a verified token says about its client.

    Attributes:
        subject: the subject claim's value (`AUTH__JWT__SUBJECT_CLAIM`).
        scopes: the scope claim's scopes.
        expires_at: `exp`, seconds since the epoch.
    """

    subject: str
    scopes: frozenset[str]
    expires_at: float


def family_algorithms(key: object) -> frozenset[str]:
    """The signature algorithms a public key can verify (RFC 7518 3.3-3.5, RFC 8037 3.1)."""
    if isinstance(key, rsa.RSAPublicKey):
        return frozenset({"RS256", "RS384", "RS512", "PS256", "PS384", "PS512"})
    if isinstance(key, ec.EllipticCurvePublicKey):
        alg = _EC_ALGORITHMS.get(key.curve.name)
        return frozenset({alg}) if alg else frozenset()
    if isinstance(key, (ed25519.Ed25519PublicKey, ed448.Ed448PublicKey)):
        return frozenset({"EdDSA"})
    return frozenset()


@dataclass(frozen=True, slots=True)
class _Key:
    key: Any
    algorithms: frozenset[str]


class JwtVerifier:
    """Verifies bearer tokens as `AUTH__JWT__...` say (see module doc).

    Args:
        settings: the JWT settings (`configured` must be true).
        reload_interval_s: how often the JWKS file is checked for changes, seconds.
        clock: wall-clock seconds since the epoch for the cache's expiry check (tests pass their own).

    Raises:
        ValueError: at construction, the key file cannot be read or holds no usable key.
    """

    def __init__(
        self, settings: JwtSettings, reload_interval_s: float, clock: Callable[[], float] = time.time
    ) -> None:
        path = settings.jwks_file or settings.public_key_file
        if path is None or settings.issuer is None or settings.audience is None:
            raise ValueError("JWT is not configured (AUTH__JWT__...)")
        self._settings = settings
        self._issuer, self._audience = settings.issuer, settings.audience
        self._allowed = frozenset(settings.algorithms)
        self._required = sorted({"exp", "iss", "aud", settings.subject_claim})
        self._clock = clock
        self._watch = FileWatch(path, reload_interval_s)
        self._cache: dict[bytes, TokenClaims] = {}
        try:
            self._keys = self._load(self._watch.read())
        except (OSError, ValueError) as exc:
            raise ValueError(f"{'AUTH__JWT__JWKS_FILE' if settings.jwks_file else 'AUTH__JWT__PUBLIC_KEY_FILE'} "
                             f"{path}: {exc}") from None

    def _load(self, data: bytes) -> dict[str | None, _Key]:
        """Keys by `kid` (None: the PEM key, or a JWK without one)."""
        if self._settings.public_key_file is not None:
            try:
                key = load_pem_public_key(data)
            except (ValueError, TypeError) as exc:
                raise ValueError(f"not a PEM public key ({type(exc).__name__})") from None
            return {None: self._usable(key, None)}
        try:
            document = json.loads(data)
            if not isinstance(document, dict) or not isinstance(document.get("keys"), list):
                raise ValueError("not a JSON object with a list of keys")
            jwks = jwt.PyJWKSet.from_dict(document)
        except (ValueError, TypeError, jwt.PyJWKError, jwt.PyJWKSetError) as exc:
            raise ValueError(f"not a JWKS with a usable key ({type(exc).__name__})") from None
        keys: dict[str | None, _Key] = {}
        declared = {entry.get("kid"): entry.get("alg") for entry in document.get("keys", []) if isinstance(entry, dict)}
        for jwk in jwks.keys:
            if jwk.public_key_use not in (None, "sig"):
                continue  # an encryption key (RFC 7517 4.2) never verifies a signature
            keys[jwk.key_id] = self._usable(jwk.key, declared.get(jwk.key_id))
        if not keys:
            raise ValueError("no signing key in the JWKS")
        return keys

    def _usable(self, key: object, declared_alg: object) -> _Key:
        algorithms = family_algorithms(key) & self._allowed
        if isinstance(declared_alg, str):
            algorithms &= {declared_alg}
        if not algorithms:
            name = type(key).__name__
            raise ValueError(f"a {name} cannot verify any of AUTH__JWT__ALGORITHMS {sorted(self._allowed)}")
        return _Key(key, algorithms)

    def _reload(self) -> None:
        try:
            keys = self._load(self._watch.read())
        except (OSError, ValueError) as exc:
            logger.error("JWT key file not reloaded, keeping the %d keys loaded before: %s", len(self._keys), exc)
            return
        self._keys = keys
        self._cache.clear()
        logger.info("JWT key file reloaded: %d keys (kids: %s)", len(keys), sorted(str(k) for k in keys))

    def verify(self, token: str) -> TokenClaims:
        """The claims of `token` once verified.

        Raises:
            TokenRefused: the token is not accepted (the description says why).
        """
        if self._watch.changed():
            self._reload()
        digest = hashlib.sha256(token.encode("ascii", "replace")).digest()
        cached = self._cache.get(digest)
        if cached is not None:
            if self._clock() < cached.expires_at + self._settings.leeway_s:
                return cached
            del self._cache[digest]
        claims = self._verify(token)
        if len(self._cache) >= CACHE_SIZE:
            del self._cache[next(iter(self._cache))]
        self._cache[digest] = claims
        return claims

    def _verify(self, token: str) -> TokenClaims:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise TokenRefused("malformed token") from None
        kid = header.get("kid")
        if not isinstance(kid, (str, type(None))):
            raise TokenRefused("malformed token")
        if self._settings.public_key_file is not None or (kid is None and len(self._keys) == 1):
            entry: _Key | None = next(iter(self._keys.values()))  # the one key: a `kid` is not needed
        else:
            entry = self._keys.get(kid)
        if entry is None:
            raise TokenRefused("unknown signing key")
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in entry.algorithms:
            raise TokenRefused("signature algorithm not allowed")
        try:
            payload = jwt.decode(
                token,
                entry.key,
                algorithms=[alg],
                audience=self._audience,
                issuer=self._issuer,
                leeway=self._settings.leeway_s,
                options={"require": self._required},
            )
        except jwt.PyJWTError as exc:
            raise TokenRefused(_description(exc)) from None
        subject = payload.get(self._settings.subject_claim)
        if not isinstance(subject, str) or not subject:
            raise TokenRefused(f"the {self._settings.subject_claim} claim is not a string")
        return TokenClaims(subject, _scopes(payload.get(self._settings.scope_claim)), float(payload["exp"]))


def _scopes(claim: object) -> frozenset[str]:
    if isinstance(claim, str):
        return frozenset(claim.split())
    if isinstance(claim, list):
        return frozenset(s for s in claim if isinstance(s, str))
    return frozenset()


# PyJWT's exceptions, most specific first -> a fixed description.
_DESCRIPTIONS: Final[tuple[tuple[type[jwt.PyJWTError], str], ...]] = (
    (jwt.ExpiredSignatureError, "token expired"),
    (jwt.ImmatureSignatureError, "token not valid yet"),
    (jwt.InvalidAudienceError, "wrong audience"),
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.MissingRequiredClaimError, "a required claim is missing (exp, iss, aud, subject)"),
    (jwt.InvalidIssuedAtError, "issued-at time is invalid"),
    (jwt.exceptions.InvalidSubjectError, "the sub claim is not a string"),
    (jwt.exceptions.InvalidJTIError, "the jti claim is not a string"),
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.InvalidAlgorithmError, "signature algorithm not allowed"),
    (jwt.DecodeError, "malformed token"),
)


def _description(exc: jwt.PyJWTError) -> str:
    for cls, text in _DESCRIPTIONS:
        if isinstance(exc, cls):
            return text
    return "invalid token"

