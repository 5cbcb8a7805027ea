"""api.security.jwt_tokens: PyJWT against a public key or a JWKS file, refusals, rotation, cache."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import time
from pathlib import Path

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from api.config.security import JwtSettings
from api.security.credentials import TokenRefused
from api.security.jwt_tokens import JwtVerifier
from tests.api.tokens import AUDIENCE, ISSUER, Issuer


def settings(issuer: Issuer, *, pem: bool = False, **overrides: object) -> JwtSettings:
    source = {"public_key_file": issuer.pem_path} if pem else {"jwks_file": issuer.jwks_path}
    return JwtSettings.model_validate({**source, "issuer": ISSUER, "audience": AUDIENCE, **overrides})


@pytest.fixture(scope="module")
def issuer(tmp_path_factory: pytest.TempPathFactory) -> Issuer:
    return Issuer.rsa(tmp_path_factory.mktemp("issuer"))


def refusal(verifier: JwtVerifier, token: str) -> str:
    with pytest.raises(TokenRefused) as caught:
        verifier.verify(token)
    assert token not in str(caught.value)
    return caught.value.description


@pytest.mark.parametrize("pem", [False, True], ids=["jwks", "pem"])
def test_a_valid_token_gives_its_subject_and_scopes(issuer: Issuer, pem: bool) -> None:
    verifier = JwtVerifier(settings(issuer, pem=pem), 5.0)
    claims = verifier.verify(issuer.token(sub="svc-a", scope="fraud:score digits:classify"))
    assert claims.subject == "svc-a" and claims.scopes == {"fraud:score", "digits:classify"}


def test_scopes_as_a_list_claim(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings(issuer, scope_claim="scp"), 5.0)
    assert verifier.verify(issuer.token(scp=["a", "b", 3])).scopes == {"a", "b"}
    assert verifier.verify(issuer.token()).scopes == frozenset()


def test_expiry_with_leeway(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings(issuer, leeway_s=30), 5.0)
    verifier.verify(issuer.token(lifetime_s=-10))  # expired 10 s ago, within the leeway
    assert refusal(verifier, issuer.token(lifetime_s=-60)) == "token expired"
    strict = JwtVerifier(settings(issuer, leeway_s=0), 5.0)
    assert refusal(strict, issuer.token(lifetime_s=-10)) == "token expired"
    assert refusal(strict, issuer.token(nbf=int(time.time()) + 60)) == "token not valid yet"


@pytest.mark.parametrize(
    ("claims", "expected"),
    [
        ({"iss": "https://other.example/"}, "wrong issuer"),
        ({"aud": "someone-else"}, "wrong audience"),
        ({"exp": None}, "a required claim is missing (exp, iss, aud, subject)"),
        ({"aud": None}, "a required claim is missing (exp, iss, aud, subject)"),
        ({"sub": None}, "a required claim is missing (exp, iss, aud, subject)"),
        ({"sub": 42}, "the sub claim is not a string"),
    ],
)
def test_claims_are_checked(issuer: Issuer, claims: dict[str, object], expected: str) -> None:
    verifier = JwtVerifier(settings(issuer), 5.0)
    assert refusal(verifier, issuer.token(**claims)) == expected


def test_an_audience_list_containing_ours_is_accepted(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings(issuer), 5.0)
    verifier.verify(issuer.token(aud=["other", AUDIENCE]))


def test_a_token_of_another_key_or_tampered_is_refused(issuer: Issuer, tmp_path: Path) -> None:
    verifier = JwtVerifier(settings(issuer), 5.0)
    stranger = Issuer.rsa(tmp_path)
    assert refusal(verifier, stranger.token()) == "bad signature"  # same kid "k1", other key
    head, body, signature = issuer.token().split(".")
    payload = json.loads(base64.urlsafe_b64decode(body + "=="))
    payload["sub"] = "admin"
    forged = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=").decode()
    assert refusal(verifier, f"{head}.{forged}.{signature}") == "bad signature"
    assert refusal(verifier, stranger.token(kid="k1", headers={"kid": "k9"})) == "unknown signing key"
    assert refusal(verifier, "not.a.jwt") == "malformed token"


def test_alg_none_and_hmac_with_the_public_key_are_refused(issuer: Issuer) -> None:
    verifier = JwtVerifier(settings(issuer), 5.0)
    payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "x", "exp": int(time.time()) + 60}
    unsigned = jwt.encode(payload, None, algorithm="none", headers={"kid": "k1"})
    assert refusal(verifier, unsigned) == "signature algorithm not allowed"
    # The classic confusion: HS256 "signed" with the public key's PEM as the shared secret.
    pem = issuer.pem_path.read_bytes()
    head = base64.urlsafe_b64encode(json.dumps({"alg": "HS256", "typ": "JWT", "kid": "k1"}).encode()).rstrip(b"=")
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).rstrip(b"=")
    mac = hmac.new(pem, head + b"." + body, hashlib.sha256).digest()
    confused = (head + b"." + body + b"." + base64.urlsafe_b64encode(mac).rstrip(b"=")).decode()
    assert refusal(verifier, confused) == "signature algorithm not allowed"


def test_hmac_algorithms_cannot_be_configured(issuer: Issuer) -> None:
    with pytest.raises(ValueError, match="not allowed"):
        settings(issuer, algorithms=["HS256"])
    with pytest.raises(ValueError, match="ISSUER and AUTH__JWT__AUDIENCE"):
        JwtSettings(jwks_file=issuer.jwks_path)


def test_the_key_family_bounds_the_algorithm(tmp_path: Path) -> None:
    issuer = Issuer.rsa(tmp_path)
    issuer.add_key("ec", Issuer.ec_key(), "ES256")
    verifier = JwtVerifier(settings(issuer), 5.0)
    assert verifier.verify(issuer.token(kid="ec", sub="ec-client")).subject == "ec-client"
    # RS256 is allowed, but the EC key cannot verify it: a token claiming it for that kid is refused.
    rsa_signed = jwt.encode({"sub": "x"}, issuer.keys["k1"], algorithm="RS256", headers={"kid": "ec"})
    assert refusal(verifier, rsa_signed) == "signature algorithm not allowed"


def test_rotation_through_the_jwks_file(tmp_path: Path) -> None:
    issuer = Issuer.rsa(tmp_path, kid="old")
    verifier = JwtVerifier(settings(issuer), 0.05)
    old = issuer.token(kid="old")
    verifier.verify(old)
    issuer.add_key("new", rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256")
    issuer.remove_key("old")
    time.sleep(0.06)  # the reload interval, on the verifier's monotonic clock
    verifier.verify(issuer.token(kid="new"))
    assert refusal(verifier, old) == "unknown signing key"  # and not served from the cache


def test_a_verified_token_is_cached_until_it_expires(issuer: Issuer) -> None:
    now = [time.time()]
    verifier = JwtVerifier(settings(issuer, leeway_s=0), 5.0, clock=lambda: now[0])
    token = issuer.token(lifetime_s=100)
    first = verifier.verify(token)
    assert verifier.verify(token) is first
    now[0] += 101  # past exp on the cache's clock: checked afresh (PyJWT reads the real clock)
    assert verifier.verify(token) is not first


def test_bad_key_files_name_the_setting(tmp_path: Path) -> None:
    (tmp_path / "jwks.json").write_text('{"keys": []}')
    jwks = JwtSettings(jwks_file=tmp_path / "jwks.json", issuer="i", audience="a")
    with pytest.raises(ValueError, match="AUTH__JWT__JWKS_FILE"):
        JwtVerifier(jwks, 1.0)
    (tmp_path / "key.pem").write_text("not a key")
    with pytest.raises(ValueError, match="AUTH__JWT__PUBLIC_KEY_FILE .*not a PEM public key"):
        JwtVerifier(JwtSettings(public_key_file=tmp_path / "key.pem", issuer="i", audience="a"), 1.0)
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (tmp_path / "key.pem").write_bytes(
        private.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with pytest.raises(ValueError, match="cannot verify any"):
        JwtVerifier(JwtSettings(public_key_file=tmp_path / "key.pem", issuer="i", audience="a",
                                algorithms=["ES256"]), 1.0)  # fmt: skip


@pytest.mark.parametrize("document", ["[]", '"keys"', '{"keys": {"kty": "RSA"}}', "{}", "not json"])
def test_a_jwks_of_the_wrong_shape_is_refused_naming_the_setting(tmp_path: Path, document: str) -> None:
    (tmp_path / "jwks.json").write_text(document)
    with pytest.raises(ValueError, match="AUTH__JWT__JWKS_FILE .*not a JWKS"):
        JwtVerifier(JwtSettings(jwks_file=tmp_path / "jwks.json", issuer="i", audience="a"), 1.0)
