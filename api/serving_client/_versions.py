"""Versions per replica: which versions of which models each serving replica has AVAILABLE, and
which version each version label names there, read from the replica itself.

During a rolling update the replicas of one tier do not agree: one has loaded v2 while another is
still loading it, or has already unloaded v1. A call pinned to one version for the whole tier then
reaches a replica that does not have it and fails (`NOT_FOUND`). `VersionTracker` keeps, for each
replica, what it serves:

- every AVAILABLE version of each tracked model, from the replica's model status (TF Serving's
  `GetModelStatus`, REST `GET /v1/models/<m>`; get_model_status_impl.cc);
- the version each tracked label names there, from the replica's model metadata asked *by the
  label* (`GetModelMetadata` with `model_spec.version_label`, REST
  `GET /v1/models/<m>/labels/<l>/metadata`), whose answer carries the version serving resolved
  (get_model_metadata_impl.cc sets `model_spec.version`). Model status cannot say: TF Serving's
  GetModelStatus ignores a label and lists every version. A label resolves only while its version
  is AVAILABLE (`NOT_FOUND` otherwise; `INVALID_ARGUMENT` "Unrecognized servable version label"
  for a label that replica's config does not have), which is exactly the condition for sending
  it calls.

`pin` answers, for one replica and one `ModelSpec`, the version that replica would run: the asked
version when it is AVAILABLE there, the label's version there, or that replica's own latest
AVAILABLE version. `ReplicatedClient` sends a call only to replicas that have a pin and pins the
call to it (`model_spec.version`), so the version in every answer is the one that ran, over REST
too, where TF Serving's predict answer does not say. "Latest" is each replica's own latest, as
behind a plain load balancer in front of TF Serving: pinning the whole tier to the newest version
anywhere would send every call to the first replica that loads it.

What is tracked: the models given at start (the enabled routes'), and any model or label a call
asks for (`ensure`, which reads every replica at once the first time), at most `max_tracked` of
each, the least recently asked dropped first. Every `interval_s` each replica is read again; a
replica with no reading yet (just discovered) is read within `RETRY_S`. A read that fails
(replica down or overloaded) keeps the replica's last reading: its calls fail and are retried on
another replica as any call's are (`_replicas`). A replica that answers `NOT_FOUND` to a pinned
call has that version forgotten at once (`forget`), so the next call goes elsewhere without
waiting for the next reading.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from api.serving_client._deadline import Deadline
from api.serving_client._errors import ServingError, ServingNotFound, ServingRejected, ServingUnavailable
from api.serving_client._types import ModelSpec, ServingClient

_log = logging.getLogger(__name__)
_K = TypeVar("_K")

#: How soon a replica with no reading (new, or whose reads failed) is read again, seconds.
RETRY_S = 0.25
#: Models, and (model, label) pairs, tracked at most (each kind); the least recently asked go first.
MAX_TRACKED = 32


@dataclass(slots=True)
class ReplicaServables:
    """What one replica serves, as last read.

    Attributes:
        available: model -> its AVAILABLE versions there (a model it does not have: empty).
        labels: (model, label) -> the version the label names there, for labels that resolve.
        read: the models and labels read at least once (a missing key means "not read yet",
            not "has none").
    """

    available: dict[str, frozenset[int]] = field(default_factory=dict)
    labels: dict[tuple[str, str], int] = field(default_factory=dict)
    read: set[str | tuple[str, str]] = field(default_factory=set)

    def pin(self, spec: ModelSpec) -> int | None:
        """The version this replica runs for `spec`, or None when it cannot serve it now."""
        versions = self.available.get(spec.name)
        if not versions:
            return None
        if spec.version is not None:
            return spec.version if spec.version in versions else None
        if spec.version_label is not None:
            version = self.labels.get((spec.name, spec.version_label))
            return version if version in versions else None
        return max(versions)

    def knows(self, spec: ModelSpec) -> bool:
        """True once what `spec` needs has been read from this replica."""
        if spec.name not in self.read:
            return False
        return spec.version_label is None or (spec.name, spec.version_label) in self.read


class VersionTracker:
    """Each replica's AVAILABLE versions and labels, kept current (see module doc).

    Args:
        replicas: the replicas calls go to now (read on every round; ones that left are dropped).
        models: models to track from the start.
        interval_s: seconds between two readings of every replica (at least `RETRY_S`).
        timeout_s: budget of one read, seconds.
        max_tracked: models, and labels, tracked at most.
    """

    def __init__(
        self,
        replicas: Callable[[], Sequence[ServingClient]],
        *,
        models: Sequence[str] = (),
        interval_s: float = 5.0,
        timeout_s: float = 1.0,
        max_tracked: int = MAX_TRACKED,
    ) -> None:
        self._replicas = replicas
        self._interval_s = max(interval_s, RETRY_S)
        self._timeout_s = timeout_s
        self._max = max_tracked
        self._models: OrderedDict[str, None] = OrderedDict((m, None) for m in models)
        self._labels: OrderedDict[tuple[str, str], None] = OrderedDict()
        self._views: dict[int, tuple[ServingClient, ReplicaServables]] = {}
        self._errors: dict[int, ServingError] = {}  # the last failed read of each replica
        self._task: asyncio.Task[None] | None = None
        self._reading: asyncio.Task[None] | None = None
        self._read_started = float("-inf")
        self._wake = asyncio.Event()

    def view(self, replica: ServingClient) -> ReplicaServables | None:
        """What `replica` serves as last read, or None before its first reading."""
        entry = self._views.get(id(replica))
        return entry[1] if entry is not None and entry[0] is replica else None

    def pin(self, replica: ServingClient, spec: ModelSpec) -> int | None:
        """The version `replica` runs for `spec` (`ReplicaServables.pin`); None if it cannot."""
        view = self.view(replica)
        return view.pin(spec) if view is not None else None

    def forget(self, replica: ServingClient, model: str, version: int) -> None:
        """`replica` answered NOT_FOUND for `version` of `model`: it no longer has it."""
        view = self.view(replica)
        if view is not None and version in view.available.get(model, ()):
            view.available[model] = view.available[model] - {version}
            _log.info("serving replica %r no longer has %s version %d", replica, model, version)
            self._wake.set()

    def describe(self, spec: ModelSpec) -> str:
        """What each replica has of `spec`'s model, for an error message."""
        parts = []
        for replica in self._replicas():
            view = self.view(replica)
            if view is None or spec.name not in view.read:
                error = self._errors.get(id(replica))
                parts.append(f"not read ({error.message})" if error is not None else "not read yet")
                continue
            versions = ", ".join(map(str, sorted(view.available.get(spec.name, ())))) or "none"
            text = f"AVAILABLE: {versions}"
            if spec.version_label is not None:
                labelled = view.labels.get((spec.name, spec.version_label))
                named = "names no AVAILABLE version" if labelled is None else f"= {labelled}"
                text += f"; label '{spec.version_label}' {named}"
            parts.append(text)
        return "; ".join(f"replica {i + 1}: {p}" for i, p in enumerate(parts)) or "no replicas"

    def last_error(self) -> ServingError | None:
        """A read error when no current replica could be read at all, else None."""
        replicas = self._replicas()
        if replicas and all(self.view(r) is None for r in replicas):
            for replica in replicas:
                error = self._errors.get(id(replica))
                if error is not None:
                    return error
        return None

    async def ensure(self, spec: ModelSpec, deadline: Deadline) -> None:
        """Track `spec`'s model (and label); when no replica has been read for it yet, read the
        replicas now and wait for that (one read shared by concurrent callers, at most one
        started per `RETRY_S`), at most until `deadline`.

        A replica that is slow to answer never holds a call up once another one is known.
        """
        newly = self._track(spec)
        if not newly and any((v := self.view(r)) is not None and v.knows(spec) for r in self._replicas()):
            return
        reading = self._reading
        if reading is None or reading.done():
            if not newly and time.monotonic() - self._read_started < RETRY_S:
                return  # just tried and learnt nothing: the caller reports what is known
            self._read_started = time.monotonic()
            reading = self._reading = asyncio.get_running_loop().create_task(self._read_all())
            reading.add_done_callback(lambda t: t.cancelled() or t.exception())
        with contextlib.suppress(TimeoutError):
            async with deadline.timeout():
                await asyncio.shield(reading)

    async def start(self) -> None:
        """Read every replica once, then keep reading them in the background."""
        await self._read_all()
        self._task = asyncio.get_running_loop().create_task(self._run(), name="serving-version-tracker")

    async def aclose(self) -> None:
        """Stop reading."""
        for task in (self._task, self._reading):
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # -- internals

    def _track(self, spec: ModelSpec) -> bool:
        """Track `spec`'s model and label (most recently asked last); True if either is new."""
        newly = _touch(self._models, spec.name, self._max)
        if spec.version_label is not None:
            newly = _touch(self._labels, (spec.name, spec.version_label), self._max) or newly
        return newly

    async def _run(self) -> None:
        last_full = time.monotonic()
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(RETRY_S):
                    await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            full = now - last_full >= self._interval_s
            try:
                if full:
                    last_full = now
                    await self._read_all()
                else:  # only replicas never read (new ones, or unreachable so far)
                    await self._read_all(unread_only=True)
            except Exception:
                _log.exception("reading the serving replicas' versions failed; retrying")

    async def _read_all(self, *, unread_only: bool = False) -> None:
        replicas = list(self._replicas())
        current = {id(r) for r in replicas}
        for key in [k for k in self._views if k not in current]:
            del self._views[key]  # a replica that left
        for key in [k for k in self._errors if k not in current]:
            del self._errors[key]
        if unread_only:
            replicas = [r for r in replicas if self.view(r) is None]
        if replicas:
            await asyncio.gather(*(self._read(r) for r in replicas))

    async def _read(self, replica: ServingClient) -> None:
        """One reading of `replica`: every tracked model's status and label."""
        previous = self.view(replica)
        view = ReplicaServables()
        if previous is not None:  # a read that fails keeps what was known
            view.available.update(previous.available)
            view.labels.update(previous.labels)
            view.read.update(previous.read)
        models = list(self._models)
        labels = list(self._labels)
        reads: list[Awaitable[None]] = [self._read_model(replica, m, view) for m in models]
        reads += [self._read_label(replica, m, label, view) for m, label in labels]
        outcomes = await asyncio.gather(*reads, return_exceptions=True)
        errors = [o for o in outcomes if isinstance(o, ServingError)]
        for outcome in outcomes:
            if isinstance(outcome, BaseException) and not isinstance(outcome, ServingError):
                raise outcome
        if errors and len(errors) == len(outcomes) and previous is None:
            self._errors[id(replica)] = errors[0]
            return  # nothing read at all: stays "not read", retried within RETRY_S
        if errors:
            self._errors[id(replica)] = errors[0]
        else:
            self._errors.pop(id(replica), None)
        self._views[id(replica)] = (replica, view)

    async def _read_model(self, replica: ServingClient, model: str, view: ReplicaServables) -> None:
        try:
            status = await replica.model_status(model, Deadline.after(self._timeout_s))
        except ServingNotFound:
            versions: frozenset[int] = frozenset()  # the model is not in that replica's config
        else:
            versions = frozenset(v.version for v in status.versions if v.state == "AVAILABLE")
        view.available[model] = versions
        view.read.add(model)

    async def _read_label(self, replica: ServingClient, model: str, label: str, view: ReplicaServables) -> None:
        try:
            metadata = await replica.model_metadata(model, None, Deadline.after(self._timeout_s), label=label)
        except (ServingNotFound, ServingRejected, ServingUnavailable) as exc:
            # NOT_FOUND: the labelled version is not loaded; INVALID_ARGUMENT: no such label there;
            # UNAVAILABLE "Model labels does not init yet": no config yet. None resolves.
            if isinstance(exc, ServingUnavailable) and "labels does not init" not in exc.message:
                raise
            view.labels.pop((model, label), None)
        else:
            view.labels[(model, label)] = metadata.version
        view.read.add((model, label))


def _touch(tracked: OrderedDict[_K, None], key: _K, limit: int) -> bool:
    """Mark `key` most recently used; add it (dropping the oldest over `limit`): True if new."""
    if key in tracked:
        tracked.move_to_end(key)
        return False
    tracked[key] = None
    while len(tracked) > limit:
        tracked.popitem(last=False)
    return True


def pins(tracker: VersionTracker, replicas: Sequence[ServingClient], spec: ModelSpec) -> Mapping[int, int]:
    """Replica index -> the version it runs for `spec`, for the replicas that can serve it."""
    found = {}
    for index, replica in enumerate(replicas):
        version = tracker.pin(replica, spec)
        if version is not None:
            found[index] = version
    return found
