"""Async client to the serving tier's REST API (TF Serving's v1 API on port 8501).

Speaks TF Serving's documented REST contract (tensorflow.org/tfx/serving/api_rest),
so the same code talks to `tensorflow_model_server` and to `python -m serving`.
Every failure of the transport or of the server is raised as a `ServingError`
subclass; httpx exceptions never leave this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx
import orjson


class ServingError(Exception):
    """The serving tier could not produce an answer.

    Attributes:
        message: human-readable reason, safe to show to API callers.
        status_code: HTTP status the serving tier answered with, if it answered.
    """

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.status_code = status_code


class ServingUnavailable(ServingError):
    """Serving is unreachable, refused the connection, or answered 5xx."""


class ServingTimeout(ServingError):
    """Serving did not answer within the configured timeout."""


class ServingNotFound(ServingError):
    """Serving answered 404: unknown model, version or label (NOT_FOUND)."""


class ServingRejected(ServingError):
    """Serving answered another 4xx: it rejected the request (INVALID_ARGUMENT, ...)."""


@dataclass(frozen=True)
class VersionStatus:
    """One entry of GetModelStatusResponse.model_version_status."""

    version: int
    state: str  # START, LOADING, AVAILABLE, UNLOADING, END
    error_message: str


def _loads(content: bytes) -> Any:
    """Parse a JSON body; falls back to the stdlib parser for TF Serving's bare
    NaN / Infinity / -Infinity tokens, which orjson (strict JSON) rejects."""
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return json.loads(content)


def _error_text(response: httpx.Response) -> str:
    """TF Serving's `{"error": "..."}` message, or the raw body if it is not one."""
    try:
        body = _loads(response.content)
        if isinstance(body, dict) and isinstance(body.get("error"), str):
            return body["error"]
    except ValueError:
        pass
    return response.text[:500] or response.reason_phrase


class RestServingClient:
    """TF Serving REST client over a shared `httpx.AsyncClient`.

    The `httpx.AsyncClient` (its base_url pointing at the serving tier, timeouts and
    pool limits set) is owned by the app's lifespan, not by this class.
    """

    def __init__(self, http: httpx.AsyncClient) -> None:
        self._http = http

    async def _request(self, method: str, path: str, body: bytes | None = None) -> Any:
        """Send one request; return the parsed JSON body of a 2xx answer.

        Raises:
            ServingTimeout, ServingUnavailable, ServingNotFound, ServingRejected.
        """
        headers = {"content-type": "application/json"} if body is not None else None
        try:
            response = await self._http.request(method, path, content=body, headers=headers)
        except httpx.TimeoutException as exc:
            raise ServingTimeout(f"serving did not answer in time ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ServingUnavailable(f"serving is unreachable ({type(exc).__name__})") from exc
        status = response.status_code
        if status < 300:
            try:
                return _loads(response.content)
            except ValueError as exc:
                raise ServingUnavailable("serving sent a body that is not JSON", status) from exc
        text = _error_text(response)
        if status == 404:
            raise ServingNotFound(text, status)
        if status >= 500:
            raise ServingUnavailable(text, status)
        raise ServingRejected(text, status)

    async def model_status(self, model_name: str) -> list[VersionStatus]:
        """`GET /v1/models/{name}`: every version's state (GetModelStatusResponse).

        Raises:
            ServingError subclasses, as `_request`.
        """
        body = await self._request("GET", f"/v1/models/{model_name}")
        return [
            VersionStatus(
                version=int(entry["version"]),
                state=str(entry.get("state", "UNKNOWN")),
                error_message=str(entry.get("status", {}).get("error_message", "")),
            )
            for entry in body.get("model_version_status", [])
        ]

    async def predict_columnar(
        self,
        model_name: str,
        inputs: Mapping[str, Sequence[Any]],
        *,
        signature_name: str = "serving_default",
        version: int | None = None,
    ) -> dict[str, Any]:
        """`POST /v1/models/{name}[/versions/{v}]:predict` in the columnar format.

        Args:
            inputs: input tensor name -> nested lists, batch first
                (e.g. {"features": [[f0, ..., f10], ...]}, float32 on the server side).
            signature_name: the SignatureDef to call.
            version: pin a version; None means the latest one serving has.

        Returns:
            output tensor name -> nested lists. TF Serving returns a bare value for a
            single-output signature; it is returned here under the key "" so callers
            handle one shape.

        Raises:
            ServingError subclasses, as `_request`.
        """
        path = f"/v1/models/{model_name}"
        if version is not None:
            path += f"/versions/{version}"
        body = orjson.dumps({"signature_name": signature_name, "inputs": inputs})
        answer = await self._request("POST", path + ":predict", body)
        outputs = answer.get("outputs") if isinstance(answer, dict) else None
        if outputs is None:
            raise ServingUnavailable("serving's predict answer has no 'outputs'")
        return outputs if isinstance(outputs, dict) else {"": outputs}
