"""Models on the serving tier, as the API's model routes call them.

`ServedModel` is one servable called through one signature, at a version the caller names (a
number, a version label, or none: the latest AVAILABLE), and returns serving's `PredictResponse`
with the version that ran. Which replica has that version, and pinning the call to it, is the
serving client's (`api.serving_client`: versions per replica), which names the version in every
answer; for a client that does not (a bare transport, whose REST answer does not say), the latest
AVAILABLE version read from model status and cached (`LatestVersion`) is reported. Every model
route (`api.routes.model_endpoint`, through its rollout, `api.rollouts`) calls its models through
these. With `shedding` on, it refuses at once a request whose remaining budget is below the
model's current median latency (`api.request.admission.shedding`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence

from api.request.admission.shedding import LatencyEstimate
from api.serving_client import (
    Deadline,
    DeadlineExceeded,
    ModelSpec,
    PredictRequest,
    PredictResponse,
    ServingBadResponse,
    ServingClient,
    ServingTimeout,
    ServingUnavailable,
    Tensor,
)


class LatestVersion:
    """The latest AVAILABLE version of one model, read from serving's model status: what an
    answer that does not name its version is reported as.

    Cached for `ttl_s` seconds (monotonic clock). Concurrent refreshes share one status
    call, which runs under its own `status_timeout_s` budget, so a caller that gives up
    does not fail it for the others; each caller waits at most until its own deadline.
    """

    def __init__(
        self, client: ServingClient, model_name: str, ttl_s: float, *, status_timeout_s: float = 2.0
    ) -> None:
        self._client = client
        self._model_name = model_name
        self._ttl_s = ttl_s
        self._status_timeout_s = status_timeout_s
        self._version: int | None = None
        self._read_at = float("-inf")
        self._refresh: asyncio.Task[int] | None = None

    def invalidate(self) -> None:
        """Forget the cached version; the next `get` reads model status."""
        self._read_at = float("-inf")

    async def get(self, deadline: Deadline | None = None) -> int:
        """The version to pin predicts to; waits at most until `deadline` (default:
        `status_timeout_s` from now).

        Raises:
            ServingUnavailable: serving reports no AVAILABLE version.
            ServingTimeout: `deadline` passed while waiting for model status.
            ServingError: the status call itself failed.
        """
        if self._version is not None and time.monotonic() - self._read_at < self._ttl_s:
            return self._version
        if self._refresh is None or self._refresh.done():
            self._refresh = asyncio.get_running_loop().create_task(self._read())
            # Every waiter may have given up; mark the error seen so it is not logged
            # as "never retrieved" (each waiter still gets it raised).
            self._refresh.add_done_callback(lambda t: t.cancelled() or t.exception())
        if deadline is None:
            deadline = Deadline.after(self._status_timeout_s)
        try:
            async with deadline.timeout():
                return await asyncio.shield(self._refresh)
        except TimeoutError:
            raise ServingTimeout("no model status within the request deadline") from None

    async def _read(self) -> int:
        status = await self._client.model_status(self._model_name, Deadline.after(self._status_timeout_s))
        version = status.latest_available()
        if version is None:
            states = ", ".join(f"{v.version}: {v.state}" for v in status.versions) or "none"
            raise ServingUnavailable(f"model '{self._model_name}' has no AVAILABLE version ({states})")
        self._version = version
        self._read_at = time.monotonic()
        return version


class ServedModel:
    """One model on the serving tier, called through one signature.

    Args:
        client: the worker's serving client.
        model_name: servable name (models.config `name`).
        signature_name: SignatureDef key.
        version_ttl_s: how long the latest AVAILABLE version is trusted, seconds (for a client
            whose answers do not name their version).
        status_timeout_s: budget of one model-status call, seconds.
        shedding: refuse a request whose remaining budget is below the model's current
            median latency, without calling serving (`api.request.admission.shedding`).
    """

    def __init__(
        self,
        client: ServingClient,
        *,
        model_name: str,
        signature_name: str = "serving_default",
        version_ttl_s: float,
        status_timeout_s: float,
        shedding: bool = False,
    ) -> None:
        self.model_name = model_name
        self.shedding = shedding
        self.latency = LatencyEstimate()
        self.signature_name = signature_name
        self.client = client
        self.latest = LatestVersion(client, model_name, version_ttl_s, status_timeout_s=status_timeout_s)
        # One spec per version asked for, built once, not per call.
        self._specs: dict[tuple[int | None, str | None], ModelSpec] = {}

    def spec(self, version: int | None = None, label: str | None = None) -> ModelSpec:
        """The `ModelSpec` of this model and signature at `version` or `label` (neither: latest).

        Raises:
            ValueError: both given.
        """
        key = (version, label)
        spec = self._specs.get(key)
        if spec is None:
            spec = ModelSpec(self.model_name, self.signature_name, version, label)
            if len(self._specs) < 64:  # pinned versions come from requests: keep the cache bounded
                self._specs[key] = spec
        return spec

    async def predict(
        self,
        inputs: Mapping[str, Tensor],
        deadline: Deadline,
        *,
        outputs: Sequence[str] = (),
        version: int | None = None,
        label: str | None = None,
    ) -> PredictResponse:
        """Run the signature on `inputs` at `version`, or the version `label` names, or the latest
        AVAILABLE (neither given).

        Args:
            inputs: signature input name -> tensor (dtype set), batch first.
            deadline: the request's deadline.
            outputs: output names the caller needs; each must be in the answer. A
                single unnamed output (TF Serving's REST answer for a one-output
                signature) is returned under the only name asked for.
            version / label: TF Serving's `model_spec.version` / `model_spec.version_label`.

        Returns:
            The answer (`PredictResponse`, the serving client's, as for every call to serving):
            output name -> tensor, batch first; `model_version` always set, to the version
            that ran.

        Raises:
            DeadlineExceeded: shedding is on and less of the budget is left than the
                model's current median latency (serving is not called).
            ServingBadResponse: an asked-for output is missing.
            ServingNotFound: no replica has that version (or label) AVAILABLE.
            ServingError subclasses from the client.
        """
        if self.shedding:
            typical = self.latency.median()
            left = deadline.remaining()
            if typical is not None and left < typical:
                raise DeadlineExceeded(
                    f"{max(left, 0.0) * 1000:.0f} ms of the request's budget left, less than the "
                    f"{typical * 1000:.0f} ms model '{self.model_name}' takes now (median of its recent "
                    "calls): refused without calling serving"
                )
        started = time.monotonic()
        spec = self.spec(version, label)
        request = PredictRequest(spec, inputs, tuple(outputs))
        try:
            response = await self.client.predict(request, deadline)
        except ServingTimeout:
            # Ran out of time: the model takes at least this long now. Counting it keeps
            # the estimate honest when overload leaves few calls that succeed at all.
            self.latency.record(time.monotonic() - started)
            raise
        named = dict(response.outputs)
        if len(outputs) == 1 and set(named) == {""}:
            named = {outputs[0]: named[""]}
        missing = [name for name in outputs if name not in named]
        if missing:
            raise ServingBadResponse(
                f"model '{self.model_name}' answered without output(s) {missing}; got {sorted(named)}"
            )
        self.latency.record(time.monotonic() - started)
        ran = response.model_version
        if ran is None:  # a client that does not say (see module doc)
            ran = version if version is not None else await self.latest.get(deadline)
        return PredictResponse(named, ran)
