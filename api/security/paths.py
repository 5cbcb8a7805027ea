"""Path patterns: which rule of a table a request path falls under.

A pattern is an exact path (`/v1/fraud/score`) or a prefix ending in `*` (`/v2/models/*`; `/*`
is every path). The longest pattern that matches wins, an exact one before any prefix, so
`{"/*": a, "/v1/fraud/score": b}` gives `b` on the fraud route and `a` elsewhere. Paths are
matched as the server decoded them (ASGI's `scope["path"]`, percent-decoded, without the
query), which is what the app's router matches too; the gRPC front passes its full method
name (`/package.Service/Method`).

One exact-dict lookup, then at most one `startswith` per prefix pattern: well under a
microsecond for the handful of patterns a deployment has.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Generic, TypeVar

T = TypeVar("T")


class PathTable(Generic[T]):
    """Values by path pattern (see module doc).

    Args:
        patterns: pattern -> value.

    Raises:
        ValueError: a pattern does not start with `/`, or has `*` anywhere but at its end.
    """

    def __init__(self, patterns: Mapping[str, T]) -> None:
        for pattern in patterns:
            if not pattern.startswith("/") or "*" in pattern[:-1]:
                raise ValueError(f"path pattern {pattern!r}: an exact path or a prefix ending in '*'")
        self._exact = {p: (p, v) for p, v in patterns.items() if not p.endswith("*")}
        self._prefixes = sorted(
            ((p[:-1], (p, v)) for p, v in patterns.items() if p.endswith("*")),
            key=lambda item: len(item[0]),
            reverse=True,
        )

    def __bool__(self) -> bool:
        return bool(self._exact or self._prefixes)

    def match(self, path: str) -> tuple[str, T] | None:
        """(the pattern, its value) for `path`, or None when no pattern matches."""
        found = self._exact.get(path)
        if found is not None:
            return found
        for prefix, entry in self._prefixes:
            if path.startswith(prefix):
                return entry
        return None

    @classmethod
    def of(cls, patterns: Iterable[str]) -> PathTable[bool]:
        """A table that says only whether a path matches one of `patterns` (public paths)."""
        return PathTable(dict.fromkeys(patterns, True))
