"""Fraud scoring: features in, scores out, through the serving tier.

`FraudScorer` knows the fraud model's signature (input `features`, output
`fraud_score`) and which version it is talking to. TF Serving's REST predict answer
does not say which version ran, so the scorer reads the latest AVAILABLE version from
model status (cached for `ttl_s`) and pins each predict to it; when that version has
been unloaded meanwhile (404), it reads status again and retries once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from dataclasses import dataclass

from api.serving_client import RestServingClient, ServingNotFound, ServingUnavailable

INPUT_NAME = "features"
OUTPUT_NAME = "fraud_score"


@dataclass(frozen=True)
class Scores:
    """Scores for a batch of rows and the model version that produced them."""

    values: list[float]  # one probability in 0..1 per input row
    version: int


class LatestVersion:
    """The latest AVAILABLE version of one model, read from serving's model status.

    Cached for `ttl_s` seconds (monotonic clock); concurrent refreshes are merged
    into one status call.
    """

    def __init__(self, client: RestServingClient, model_name: str, ttl_s: float) -> None:
        self._client = client
        self._model_name = model_name
        self._ttl_s = ttl_s
        self._version: int | None = None
        self._read_at = float("-inf")
        self._lock = asyncio.Lock()

    def invalidate(self) -> None:
        """Forget the cached version; the next `get` reads model status."""
        self._read_at = float("-inf")

    async def get(self) -> int:
        """The version to pin predicts to.

        Raises:
            ServingUnavailable: serving reports no AVAILABLE version.
            ServingError: the status call itself failed.
        """
        if time.monotonic() - self._read_at < self._ttl_s and self._version is not None:
            return self._version
        async with self._lock:
            if time.monotonic() - self._read_at < self._ttl_s and self._version is not None:
                return self._version
            statuses = await self._client.model_status(self._model_name)
            available = [s.version for s in statuses if s.state == "AVAILABLE"]
            if not available:
                states = ", ".join(f"{s.version}: {s.state}" for s in statuses) or "none"
                raise ServingUnavailable(
                    f"model '{self._model_name}' has no AVAILABLE version ({states})"
                )
            self._version = max(available)
            self._read_at = time.monotonic()
            return self._version


class FraudScorer:
    """Scores feature rows with the fraud model on the serving tier."""

    def __init__(
        self,
        client: RestServingClient,
        *,
        model_name: str,
        signature_name: str,
        version_ttl_s: float,
    ) -> None:
        self.model_name = model_name
        self._client = client
        self._signature_name = signature_name
        self.latest = LatestVersion(client, model_name, version_ttl_s)

    async def score(self, rows: Sequence[Sequence[float]]) -> Scores:
        """Score rows of `api.features.FEATURE_NAMES` floats, shape [n, N_FEATURES].

        Returns:
            `Scores` with n values in 0..1.

        Raises:
            ServingError subclasses (see `api.serving_client`).
        """
        for attempt in (1, 2):
            version = await self.latest.get()
            try:
                outputs = await self._client.predict_columnar(
                    self.model_name,
                    {INPUT_NAME: rows},
                    signature_name=self._signature_name,
                    version=version,
                )
            except ServingNotFound:
                # The pinned version went away (a newer one replaced it): re-read once.
                self.latest.invalidate()
                if attempt == 2:
                    raise
                continue
            column = outputs.get(OUTPUT_NAME, outputs.get(""))
            if not isinstance(column, list) or len(column) != len(rows):
                raise ServingUnavailable(
                    f"serving answered {OUTPUT_NAME} of the wrong shape for {len(rows)} rows"
                )
            try:
                values = [float(_scalar(v)) for v in column]  # type: ignore[arg-type]
            except (TypeError, ValueError) as exc:
                raise ServingUnavailable(f"serving answered a non-numeric {OUTPUT_NAME}") from exc
            return Scores(values=values, version=version)
        raise AssertionError("unreachable")


def _scalar(value: object) -> object:
    """A row's score: TF Serving writes a [batch, 1] output as [[s], ...]."""
    while isinstance(value, list) and len(value) == 1:
        value = value[0]
    return value
