"""Pre-built 503s for requests refused for load, so that a refusal costs as little as it can.

Under overload most requests are refused (at 3x capacity, two of every three), and each
refusal's CPU comes out of what the worker has left for the requests it admits: at 3x, with
a scored request costing about 0.5 ms of the CPU both tiers share, goodput stays at 90 % of
capacity only while a refusal costs at most ~25 µs, loopback TCP included (`docs/hardening.md`).
Built field by field, the answer (its detail, its JSON body, its head with the server's
`Date`, the labelled counter) was half of the Python a refusal ran: measured in process
(`ApiHttpProtocol.data_received` fed 20,000 keep-alive requests that admission refuses, no
socket; Intel Xeon with AVX-512), 20 µs per refusal before, 10 µs with these templates, the
counter's child cached and no head timer armed for a head that arrived whole. Every byte of
the answer but the request id is the same from one refusal to the next within a second, so
the response is built once per `Date` tick and kind, with a placeholder where the id goes,
and joined around each fresh id.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

__all__ = ["ShedAnswers"]

#: Where the request id goes while the template is built: as long as a real id (32 hex
#: digits, `api.request.context.new_request_id`) and never part of a detail or a header.
_PLACEHOLDER: Final = "ridRIDridRIDridRIDridRIDridRIDri"
#: Templates kept per `Date` tick at most (kinds of refusal x OIP or not x keep-alive x the
#: in-flight detail, whose count changes): a bound, not a figure that is reached.
_MAX_TEMPLATES: Final = 64


class ShedAnswers:
    """The responses to refused requests of one server, as templates split at the request id.

    `answer(key, default_headers, build, request_id)` returns `build(placeholder_id)` with
    the placeholder replaced by `request_id`; `build` runs only when no template for `key`
    exists since `default_headers` (uvicorn's `server_state.default_headers`, a new list on
    each `Date` tick) last changed. Not thread-safe (one event loop calls it).
    """

    def __init__(self) -> None:
        self._headers: object = None
        self._templates: dict[object, list[bytes]] = {}

    def answer(
        self, key: object, default_headers: object, build: Callable[[str], bytes], request_id: str
    ) -> bytes:
        """The response for `key` with `request_id` (32 ASCII characters) in it.

        Raises:
            ValueError: `build`'s response does not hold the placeholder exactly twice (once
                in its head, once in its body): it cannot be a template.
        """
        if default_headers is not self._headers:
            self._headers = default_headers
            self._templates = {}
        parts = self._templates.get(key)
        if parts is None:
            parts = build(_PLACEHOLDER).split(_PLACEHOLDER.encode("ascii"))
            if len(parts) != 3:
                raise ValueError(f"a refusal's response holds its request id {len(parts) - 1} times, not twice")
            if len(self._templates) >= _MAX_TEMPLATES:
                self._templates.clear()
            self._templates[key] = parts
        return request_id.encode("ascii").join(parts)
