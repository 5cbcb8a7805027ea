"""The credential a request presents, read from its headers (ASGI) or metadata (gRPC).

Two places, as clients send them:

- `Authorization: Bearer <token>` (RFC 6750 2.1): a JWT (three base64url parts joined by
  dots, RFC 7515 7.1) or an API key (keys made by `api.security.api_keys.new_key` have no dot);
  every HTTP client, Prometheus' `authorization` and gRPC's call credentials can send it;
- the API key header (`AUTH__API_KEY_HEADER`, `X-API-Key` by default).

Either container of pairs works: ASGI's `[(b"authorization", b"Bearer ..."), ...]` and gRPC's
invocation metadata `(("authorization", "Bearer ..."), ...)`; both carry names in lower case.
A credential sent twice (the same header repeated, or both places) is refused as ambiguous,
like a malformed one: which one would be checked is the kind of difference an attacker looks for.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

_AUTHORIZATION: Final = "authorization"
# RFC 6750 2.1's b64token, and a bound well under any header limit.
_B64TOKEN: Final = re.compile(r"[A-Za-z0-9\-._~+/]+=*")
MAX_CREDENTIAL_CHARS: Final = 8192

Header = tuple[bytes | str, bytes | str]


@dataclass(frozen=True, slots=True)
class Presented:
    """What a request carries.

    Attributes:
        token: the bearer token or API key, None when there is none.
        kind: "jwt" (a bearer value shaped as a JWS), "api_key", or None.
        problem: why what was sent cannot be used (unsupported scheme, malformed, repeated),
            a fixed text that never quotes it; None when it can.
    """

    token: str | None
    kind: str | None
    problem: str | None = None


NOTHING: Final = Presented(None, None)


class TokenRefused(Exception):
    """A bearer token is not accepted; `description` says why in a fixed text (RFC 6750 3's
    `error_description`), naming no part of the token."""

    def __init__(self, description: str) -> None:
        super().__init__(description)
        self.description = description


def _text(value: bytes | str) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


def presented(headers: Iterable[Header], api_key_header: str) -> Presented:
    """The credential in `headers` (pairs of lower-case name and value, bytes or str)."""
    key_name = api_key_header.encode("latin-1")
    found: list[tuple[str, str]] = []
    for name, value in headers:
        if name in (b"authorization", _AUTHORIZATION):
            found.append((_AUTHORIZATION, _text(value)))
        elif name == key_name or name == api_key_header:
            found.append((api_key_header, _text(value)))
    if not found:
        return NOTHING
    if len(found) > 1:
        return Presented(None, None, "more than one credential sent")
    where, value = found[0]
    if where == _AUTHORIZATION:
        scheme, _, token = value.strip().partition(" ")
        if scheme.lower() != "bearer":
            return Presented(None, None, "unsupported authorization scheme (use Bearer)")
        token = token.strip(" ")
        kind = "jwt" if token.count(".") == 2 else "api_key"
    else:
        token = value.strip(" \t")
        kind = "api_key"
    if not token or len(token) > MAX_CREDENTIAL_CHARS or not _B64TOKEN.fullmatch(token):
        return Presented(None, None, "malformed credential")
    return Presented(token, kind)
