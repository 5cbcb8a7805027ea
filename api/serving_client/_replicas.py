"""Round-robin over serving replicas, with retries of UNAVAILABLE on another replica.

`ReplicatedClient` spreads calls over the replicas in turn. A call that fails with
UNAVAILABLE (nothing ran, or the connection died under it; see
`_errors.is_retryable`) is tried again on a replica it has not tried yet, at once;
once every replica has been tried, the next attempt waits a jittered exponential
backoff. Attempts stop at `max_attempts` or when the next one would start after the
request's deadline, whichever is first; the last error is raised.

An attempt that may be followed by another (attempts left, and a replica neither tried
nor ejected) gets at most `attempt_timeout_s` of the request's budget (Envoy's
`per_try_timeout`): a replica that hangs -- accepts the connection, never answers (a
stopped process, a wedged host) -- costs that long, and the call goes on to another
replica within the request's deadline. The last possible attempt gets all that is left.
Predict is a pure function of its inputs, so running it twice is safe.

Retries use tenacity: its stop, wait and retry policies are composed per call with
the request's deadline (`stop_before_delay` on the time left), once the first attempt
has failed with a retryable error -- a call whose first attempt succeeds builds no retry
object. Picking the replica is the only part tenacity does not know about; it happens
inside each attempt.

A replica that could not be connected to at all (`ServingError.replica_down`), or
whose attempt ran out of its `attempt_timeout_s`, is skipped for `eject_s` seconds
(outlier ejection), so a dead or hung replica costs one failed attempt per `eject_s`
instead of one per request; when all are ejected, the rotation goes on over all of them.

Versions per replica: given a `VersionTracker` (`_versions`), a predict or a metadata call goes
only to the replicas that have what its `model_spec` asks for AVAILABLE (a version, a label's
version, or for neither their own latest), pinned to that version (`model_spec.version`), and
its answer names that version. A replica that answers NOT_FOUND to it no longer has the version:
the tracker forgets it there and the call is retried on another replica that has it
(`VersionMissing`), within the same attempts and deadline. No replica has it: `ServingNotFound`
at once, naming what each replica has, without calling serving.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Collection, Sequence
from dataclasses import replace
from typing import TypeVar

import tenacity

from api.serving_client._deadline import Deadline
from api.serving_client._errors import ServingError, ServingNotFound, ServingTimeout, is_retryable
from api.serving_client._tracing import SERVICES, Attributes, ClientTracer, request_attributes
from api.serving_client._types import (
    ModelMetadata,
    ModelSpec,
    ModelStatus,
    PredictRequest,
    PredictResponse,
    ServingClient,
)
from api.serving_client._versions import VersionTracker, pins

T = TypeVar("T")


class AttemptTimeout(ServingTimeout):
    """One attempt ran out of its `attempt_timeout_s` while the request had time left.

    Retried on another replica; if it is the last error of the call it is answered as
    any `ServingTimeout` (504).
    """


class VersionMissing(ServingNotFound):
    """A replica answered NOT_FOUND for the version a call was pinned to (it unloaded it since
    it was read): retried on another replica that has it; if it is the last error of the call
    it is answered as any `ServingNotFound`."""


def _retryable(exc: BaseException) -> bool:
    return is_retryable(exc) or isinstance(exc, (AttemptTimeout, VersionMissing))


class RoundRobin:
    """Which replica goes next: rotation, skipping ejected and already-tried ones.

    Args:
        size: number of replicas (>= 1).
        eject_s: how long a replica marked down is skipped, seconds.
    """

    def __init__(self, size: int, eject_s: float) -> None:
        if size < 1:
            raise ValueError("at least one replica is needed")
        self._size = size
        self._eject_s = eject_s
        self._next = 0
        self._down_until = [float("-inf")] * size

    def pick(
        self, now: float, tried: frozenset[int] | set[int] = frozenset(), allowed: Collection[int] | None = None
    ) -> int:
        """The next replica in turn that is up and not in `tried`, among `allowed` (default all).

        Falls back, in this order, to the next one up (tried or not), the next one not
        tried (ejected or not), the next one at all: there is always an answer (`allowed`,
        when given, is not empty).
        """
        order = [(self._next + i) % self._size for i in range(self._size)]
        if allowed is not None:
            order = [r for r in order if r in allowed]
        up = [r for r in order if self._down_until[r] <= now]
        for candidates in (
            [r for r in up if r not in tried],
            up,
            [r for r in order if r not in tried],
            order,
        ):
            if candidates:
                chosen = candidates[0]
                self._next = (chosen + 1) % self._size
                return chosen
        raise AssertionError("unreachable")

    def untried_up(self, now: float, tried: set[int], allowed: Collection[int] | None = None) -> bool:
        """True when some replica (of `allowed`, default all) is neither in `tried` nor ejected."""
        candidates = range(self._size) if allowed is None else allowed
        return any(r not in tried and self._down_until[r] <= now for r in candidates)

    def mark_down(self, replica: int, now: float) -> None:
        """Skip `replica` until `now + eject_s`."""
        self._down_until[replica] = now + self._eject_s

    def mark_up(self, replica: int) -> None:
        """`replica` answered: stop skipping it."""
        self._down_until[replica] = float("-inf")


class ReplicatedClient:
    """A `ServingClient` over several replicas of the same serving tier.

    Args:
        replicas: one transport per replica (all REST or all gRPC).
        max_attempts: attempts per call at most, across replicas (>= 1).
        eject_s: how long a replica that refused connections or ran out of its attempt
            timeout is skipped, seconds.
        attempt_timeout_s: the longest an attempt that may be followed by another takes,
            seconds; None: every attempt may take what is left of the deadline.
        backoff_initial_s / backoff_max_s: backoff once every replica was tried:
            exponential from `backoff_initial_s`, at most `backoff_max_s`, plus up to
            `backoff_initial_s` of jitter.
        versions: each replica's AVAILABLE versions and labels: predicts and metadata calls
            go only to replicas that have what they ask for (see module doc); None sends every
            call anywhere, as asked.
        tracer: opens a span per attempt (`_tracing`), with its number and replica; None: none.
    """

    def __init__(
        self,
        replicas: Sequence[ServingClient],
        *,
        max_attempts: int,
        eject_s: float = 1.0,
        attempt_timeout_s: float | None = None,
        backoff_initial_s: float = 0.01,
        backoff_max_s: float = 0.2,
        versions: VersionTracker | None = None,
        tracer: ClientTracer | None = None,
    ) -> None:
        if max_attempts < 1:
            raise ValueError("max_attempts must be >= 1")
        self.replicas = tuple(replicas)
        self._versions = versions
        self._rotation = RoundRobin(len(self.replicas), eject_s)
        self._max_attempts = max_attempts
        self._attempt_timeout_s = attempt_timeout_s
        self._tracer = tracer
        self._backoff = tenacity.wait_exponential_jitter(
            multiplier=backoff_initial_s, max=backoff_max_s, jitter=backoff_initial_s
        )

    def __repr__(self) -> str:
        return f"ReplicatedClient({list(self.replicas)!r})"

    async def predict(self, request: PredictRequest, deadline: Deadline) -> PredictResponse:
        """Predict on the next replica (that has the version asked for, pinned to it);
        UNAVAILABLE and attempt timeouts retried on another (see module doc).

        Raises:
            ServingNotFound: no replica has the version (or label, or any version) AVAILABLE.
            ServingError subclasses from the replicas.
        """
        attributes = request_attributes(request) if self._tracer is not None else None
        versions = self._versions
        if versions is None:
            return await self._call(
                lambda replica, within: replica.predict(request, within), deadline, "Predict", attributes
            )
        spec = request.model_spec

        async def pinned(replica: ServingClient, within: Deadline) -> PredictResponse:
            version = self._pin(versions, replica, spec)
            call = replace(request, model_spec=ModelSpec(spec.name, spec.signature_name, version))
            try:
                response = await replica.predict(call, within)
            except ServingNotFound as exc:
                raise self._missing(versions, replica, spec, version, exc) from exc
            return response if response.model_version is not None else replace(response, model_version=version)

        return await self._call(pinned, deadline, "Predict", attributes, await self._serving(versions, spec, deadline))

    async def model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        """Model status from the next replica; UNAVAILABLE and attempt timeouts retried on another."""
        attributes = {"tfserving.model_spec.name": model_name}
        return await self._call(
            lambda replica, within: replica.model_status(model_name, within), deadline, "GetModelStatus", attributes
        )

    async def model_metadata(
        self, model_name: str, version: int | str | None, deadline: Deadline, *, label: str | None = None
    ) -> ModelMetadata:
        """Model metadata from the next replica (that has the version asked for, as `predict`);
        UNAVAILABLE and attempt timeouts retried on another. A str `version` is a label."""
        if isinstance(version, str):
            version, label = None, version
        attributes: dict[str, int | str] = {"tfserving.model_spec.name": model_name}
        if version is not None:
            attributes["tfserving.model_spec.version"] = version
        elif label is not None:
            attributes["tfserving.model_spec.version_label"] = label
        versions = self._versions
        if versions is None:
            asked = version
            return await self._call(
                lambda replica, within: replica.model_metadata(model_name, asked, within, label=label),
                deadline,
                "GetModelMetadata",
                attributes,
            )
        spec = ModelSpec(model_name, version=version, version_label=label)

        async def pinned(replica: ServingClient, within: Deadline) -> ModelMetadata:
            resolved = self._pin(versions, replica, spec)
            try:
                return await replica.model_metadata(model_name, resolved, within)
            except ServingNotFound as exc:
                raise self._missing(versions, replica, spec, resolved, exc) from exc

        return await self._call(
            pinned, deadline, "GetModelMetadata", attributes, await self._serving(versions, spec, deadline)
        )

    async def _serving(self, versions: VersionTracker, spec: ModelSpec, deadline: Deadline) -> frozenset[int]:
        """The indices of the replicas that have what `spec` asks for (read now if unknown).

        Raises:
            ServingUnavailable (or the read's error): no replica could be read at all.
            ServingNotFound: none has it.
        """
        found = pins(versions, self.replicas, spec)
        if not found:
            await versions.ensure(spec, deadline)
            found = pins(versions, self.replicas, spec)
        if not found:
            error = versions.last_error()
            if error is not None:
                raise type(error)(error.message, error.code, target=error.target)
            raise ServingNotFound(f"no serving replica has {spec.describe()} AVAILABLE ({versions.describe(spec)})")
        return frozenset(found)

    @staticmethod
    def _pin(versions: VersionTracker, replica: ServingClient, spec: ModelSpec) -> int:
        """The version `replica` runs for `spec` now; VersionMissing when it lost it since the
        call chose it (a retry on a replica already tried)."""
        version = versions.pin(replica, spec)
        if version is None:
            raise VersionMissing(f"{spec.describe()} is no longer AVAILABLE on this replica")
        return version

    @staticmethod
    def _missing(
        versions: VersionTracker, replica: ServingClient, spec: ModelSpec, version: int, exc: ServingNotFound
    ) -> ServingNotFound:
        """The error for a replica's NOT_FOUND to a call pinned to `version` (TF Serving's
        "Servable not found for request: Specific(m, v)": that replica does not have it, whether
        it unloaded the version or the model): the version is forgotten there and the call may
        move on (`VersionMissing`). A missing signature is another code (FAILED_PRECONDITION)."""
        versions.forget(replica, spec.name, version)
        return VersionMissing(exc.message, exc.code, status_code=exc.status_code, target=exc.target)

    async def aclose(self) -> None:
        """Close every replica's transport."""
        for replica in self.replicas:
            await replica.aclose()

    async def _call(
        self,
        fn: Callable[[ServingClient, Deadline], Awaitable[T]],
        deadline: Deadline,
        method: str,
        attributes: Attributes | None = None,
        allowed: frozenset[int] | None = None,
    ) -> T:
        tried: set[int] = set()
        trace = (method, attributes or {})
        # The first attempt runs without tenacity: building its retry object and iterating
        # its attempt loop cost about 20 us of CPU per call (measured with an in-process
        # transport, 34 us with it against 12 us without), paid on every successful call.
        # Only a retryable failure builds it.
        try:
            return await self._attempt(fn, deadline, tried, 1, trace, allowed)
        except ServingError as exc:
            if self._max_attempts == 1 or not _retryable(exc):
                raise
            first_error: ServingError | None = exc
        rotation = self._rotation

        def wait(state: tenacity.RetryCallState) -> float:
            # Another replica is worth trying at once; after a full round, back off.
            if rotation.untried_up(time.monotonic(), tried, allowed):
                return 0.0
            return self._backoff(state)

        retrying = tenacity.AsyncRetrying(
            stop=tenacity.stop_after_attempt(self._max_attempts)
            | tenacity.stop_before_delay(max(0.0, deadline.remaining())),
            wait=wait,
            retry=tenacity.retry_if_exception(_retryable),
            reraise=True,
        )
        async for attempt in retrying:
            with attempt:
                if first_error is not None:
                    # tenacity's attempt 1 is the one already made: its error decides, as any
                    # other attempt's would, whether and after which wait the next one runs.
                    error, first_error = first_error, None
                    raise error
                return await self._attempt(fn, deadline, tried, attempt.retry_state.attempt_number, trace, allowed)
        raise AssertionError("unreachable: tenacity re-raises the last error")

    async def _attempt(
        self,
        fn: Callable[[ServingClient, Deadline], Awaitable[T]],
        deadline: Deadline,
        tried: set[int],
        number: int,
        trace: tuple[str, Attributes],
        allowed: frozenset[int] | None = None,
    ) -> T:
        """Attempt `number` (1 = the first) on the next replica of `allowed` not in `tried`
        (which it joins); `trace` is the method and attributes of its span when there is a tracer."""
        rotation = self._rotation
        now = time.monotonic()
        index = rotation.pick(now, tried, allowed)
        tried.add(index)
        within = deadline
        if (
            self._attempt_timeout_s is not None
            and number < self._max_attempts
            and rotation.untried_up(now, tried, allowed)
            and deadline.expires_at > now + self._attempt_timeout_s
        ):
            within = Deadline(now + self._attempt_timeout_s)  # another attempt may follow
        try:
            if self._tracer is None:
                result = await fn(self.replicas[index], within)
            else:
                result = await self._traced(fn, self.replicas[index], within, number, trace)
        except ServingTimeout as exc:
            if within is deadline:
                raise
            rotation.mark_down(index, time.monotonic())
            raise AttemptTimeout(
                f"no answer within the attempt timeout of {self._attempt_timeout_s:g} s",
                target=exc.target,
            ) from exc
        except ServingError as exc:
            if exc.replica_down:
                rotation.mark_down(index, time.monotonic())
            raise
        rotation.mark_up(index)
        return result

    async def _traced(
        self,
        fn: Callable[[ServingClient, Deadline], Awaitable[T]],
        replica: ServingClient,
        within: Deadline,
        number: int,
        trace: tuple[str, Attributes],
    ) -> T:
        """`fn(replica, within)` inside the tracer's span of attempt `number`."""
        assert self._tracer is not None
        method, attributes = trace
        span_attributes = {
            **attributes,
            "rpc.service": SERVICES.get(method, ""),
            "rpc.method": method,
            "server.address": replica_target(replica),
            "tfserving.attempt": number,
        }
        with self._tracer.attempt(method, span_attributes) as annotate:
            result = await fn(replica, within)
            if isinstance(result, PredictResponse) and result.model_version is not None:
                annotate("tfserving.model_spec.version", result.model_version)
            return result


def replica_target(replica: ServingClient) -> str:
    """The replica a transport calls ("http://10.0.0.3:8501", "10.0.0.3:8500"), for spans."""
    target = getattr(replica, "target", None) or getattr(getattr(replica, "transport", None), "target", None)
    return str(target) if target else repr(replica)
