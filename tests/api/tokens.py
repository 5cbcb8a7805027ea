"""Test credentials: an identity provider's signing keys and tokens, API key files, and the
hand-moved clock their reload intervals (and the rate limits' buckets) are tested with.

    issuer = Issuer.rsa(tmp_path)                    # an RSA key pair, its JWKS file written
    token = issuer.token(sub="svc-a", scope="fraud:score")
    keys = KeyFile(tmp_path / "api-keys"); key = keys.add("ci", "fraud:score")
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

from api.security.api_keys import key_line, new_key

ISSUER = "https://idp.example.test/"
AUDIENCE = "tfserve-split-test"


@dataclass
class Issuer:
    """Signs tokens with its private keys; `jwks_path` holds the public keys by `kid`."""

    folder: Path
    keys: dict[str, Any] = field(default_factory=dict)  # kid -> private key
    algorithms: dict[str, str] = field(default_factory=dict)  # kid -> alg

    @classmethod
    def rsa(cls, folder: Path, kid: str = "k1") -> Issuer:
        issuer = cls(folder)
        issuer.add_key(kid, rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")
        return issuer

    @property
    def jwks_path(self) -> Path:
        return self.folder / "jwks.json"

    @property
    def pem_path(self) -> Path:
        """The PEM public key of the first key."""
        return self.folder / "public.pem"

    def add_key(self, kid: str, private: Any, alg: str) -> None:
        self.keys[kid] = private
        self.algorithms[kid] = alg
        self.write()

    def remove_key(self, kid: str) -> None:
        del self.keys[kid]
        self.write()

    def write(self) -> None:
        entries = []
        for kid, private in self.keys.items():
            is_rsa = isinstance(private, rsa.RSAPrivateKey)
            algorithm = jwt.algorithms.RSAAlgorithm if is_rsa else jwt.algorithms.ECAlgorithm
            entry = json.loads(algorithm.to_jwk(private.public_key()))
            entries.append({**entry, "kid": kid, "use": "sig", "alg": self.algorithms[kid]})
        self.jwks_path.write_text(json.dumps({"keys": entries}))
        if self.keys:
            first = next(iter(self.keys.values()))
            self.pem_path.write_bytes(
                first.public_key().public_bytes(
                    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
                )
            )

    def token(self, *, kid: str | None = None, lifetime_s: float = 300.0, headers: dict[str, Any] | None = None,
              **claims: Any) -> str:
        """A signed token: iss, aud, sub, iat, exp by default, then `claims` (None removes one)."""
        kid = kid or next(iter(self.keys))
        now = time.time()
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "svc-a", "iat": int(now), "exp": int(now + lifetime_s)}
        payload.update(claims)
        payload = {k: v for k, v in payload.items() if v is not None}
        header = {"kid": kid, **(headers or {})}
        return jwt.encode(payload, self.keys[kid], algorithm=self.algorithms[kid], headers=header)

    @staticmethod
    def ec_key() -> Any:
        return ec.generate_private_key(ec.SECP256R1())


class Clock:
    """Monotonic seconds that move only when a test moves them (`clock.now += 5`)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class KeyFile:
    """An API key file written as the tool writes it; `add` returns the new key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lines: dict[str, str] = {}
        self.write()

    def add(self, key_id: str, *scopes: str) -> str:
        key = new_key()
        self.lines[key_id] = key_line(key_id, key, list(scopes))
        self.write()
        return key

    def revoke(self, key_id: str) -> None:
        del self.lines[key_id]
        self.write()

    def write(self) -> None:
        # Through a rename, as the tool and a Kubernetes Secret update do.
        temp = self.path.with_name(self.path.name + ".tmp")
        temp.write_text("# test keys\n" + "".join(line + "\n" for line in self.lines.values()))
        temp.replace(self.path)


def auth_env(*, keys: KeyFile | None = None, issuer: Issuer | None = None, scopes: dict[str, str] | None = None,
             reload_s: float = 5.0, extra: Sequence[tuple[str, str]] = ()) -> dict[str, str]:
    """The AUTH__ environment of an API process with these sources."""
    env = {"AUTH__ENABLED": "true", "AUTH__RELOAD_INTERVAL_S": str(reload_s)}
    if keys is not None:
        env["AUTH__API_KEYS_FILE"] = str(keys.path)
    if issuer is not None:
        env.update(AUTH__JWT__JWKS_FILE=str(issuer.jwks_path), AUTH__JWT__ISSUER=ISSUER, AUTH__JWT__AUDIENCE=AUDIENCE)
    if scopes:
        env["AUTH__SCOPES"] = json.dumps(scopes)
    env.update(extra)
    return env
