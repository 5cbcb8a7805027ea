"""Which models the OIP front answers for, which version a request means, and their signatures.

OIP's `versions/{v}` is a string: digits name a version (TF Serving's `model_spec.version`),
anything else a version label (`model_spec.version_label`, models.config's `version_labels`),
and no version the latest AVAILABLE one, as TF Serving picks it. `Catalog.resolve` turns the
request's model and version into the version number a Predict is pinned to, with that
version's SignatureDefs (GetModelMetadata), so the answer always names the version that ran
(TF Serving's REST answer does not say) and the request can be checked against the signature
before serving is called.

Each worker caches what it read: model status per model and metadata per version (a label's
too), each for `ttl_s` seconds (`MODEL_VERSION_TTL_S`, as the model routes' latest version),
at most `max_entries` of each, the least recently used dropped first. A predict that meets
NOT_FOUND (the version went away) drops the model's entries (`forget`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypeVar

from api.config.oip import Exposure
from api.oip.datatypes import datatype_of
from api.oip.types import ModelMetadata, OipError, TensorMetadata, invalid, not_found
from api.serving_client import (
    Code,
    Deadline,
    DeadlineExceeded,
    ModelStatus,
    ServingClient,
    ServingError,
    ServingNotFound,
    SignatureInfo,
    TensorInfo,
)
from api.serving_client import ModelMetadata as ServedMetadata

#: The platform OIP names a TensorFlow SavedModel with (its REST spec, "Platforms").
PLATFORM = "tensorflow_savedmodel"
_K = TypeVar("_K")
_V = TypeVar("_V")


class _TtlCache(Generic[_K, _V]):
    """At most `size` entries, each trusted for `ttl_s` seconds (monotonic clock), LRU."""

    def __init__(self, size: int, ttl_s: float) -> None:
        self._size = size
        self._ttl_s = ttl_s
        self._entries: OrderedDict[_K, tuple[float, _V]] = OrderedDict()

    def get(self, key: _K) -> _V | None:
        entry = self._entries.get(key)
        if entry is None or time.monotonic() - entry[0] >= self._ttl_s:
            return None
        self._entries.move_to_end(key)
        return entry[1]

    def put(self, key: _K, value: _V) -> None:
        self._entries[key] = (time.monotonic(), value)
        self._entries.move_to_end(key)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)

    def drop(self, match: object) -> None:
        """Drop every entry whose key is `match` or a tuple starting with it."""
        for key in [k for k in self._entries if k == match or (isinstance(k, tuple) and k[0] == match)]:
            del self._entries[key]


@dataclass(frozen=True, slots=True)
class Resolved:
    """A request's model and version as serving has them.

    Attributes:
        name: the servable name.
        version: the version number predicts are pinned to.
        pinned: True when the request named the number itself (a NOT_FOUND is then the
            answer, not a reason to read status again).
        available: every AVAILABLE version of the model, ascending.
        signatures: that version's SignatureDefs by key.
    """

    name: str
    version: int
    pinned: bool
    available: tuple[int, ...]
    signatures: Mapping[str, SignatureInfo]

    def signature(self, key: str) -> SignatureInfo:
        """The SignatureDef `key`.

        Raises:
            OipError: INVALID_ARGUMENT (400) when the version has no such signature.
        """
        found = self.signatures.get(key)
        if found is None:
            known = ", ".join(sorted(self.signatures)) or "none"
            raise invalid(f"model '{self.name}' version {self.version} has no signature '{key}' (it has: {known})")
        return found

    def metadata(self, signature_name: str) -> ModelMetadata:
        """OIP model metadata: the AVAILABLE versions and the signature's tensors by name.

        Raises:
            OipError: as `signature`.
        """
        signature = self.signature(signature_name)
        return ModelMetadata(
            name=self.name,
            versions=tuple(str(v) for v in self.available),
            platform=PLATFORM,
            inputs=_tensors(signature.inputs),
            outputs=_tensors(signature.outputs),
        )


def _tensors(infos: Mapping[str, TensorInfo]) -> tuple[TensorMetadata, ...]:
    out = []
    for name in sorted(infos):
        info = infos[name]
        datatype = datatype_of(info.dtype)
        # An unknown rank has no OIP shape; [-1] says "variable" without claiming a rank.
        shape = info.shape if info.shape is not None else (-1,)
        out.append(TensorMetadata(name, datatype.name if datatype is not None else "INVALID", shape))
    return tuple(out)


class Catalog:
    """The exposed models of one worker, resolved against serving (see module doc).

    Args:
        client: the worker's serving client.
        exposure: which models are exposed (`OIP__MODELS`).
        ttl_s: how long a model status or metadata read is trusted, seconds.
        max_entries: entries of each cache at most.
    """

    def __init__(self, client: ServingClient, exposure: Exposure, *, ttl_s: float, max_entries: int) -> None:
        self.client = client
        self.exposure = exposure
        self._status: _TtlCache[str, ModelStatus] = _TtlCache(max_entries, ttl_s)
        self._metadata: _TtlCache[tuple[str, int | str], ServedMetadata] = _TtlCache(max_entries, ttl_s)

    def forget(self, model_name: str) -> None:
        """Drop what is cached of `model_name` (its version went away)."""
        self._status.drop(model_name)
        self._metadata.drop(model_name)

    async def resolve(self, model_name: str, version: str | None, deadline: Deadline) -> Resolved:
        """The version `version` means for `model_name`, with its signatures.

        Raises:
            OipError: NOT_FOUND (404) for a model not exposed or serving has not, or a version
                or label it has not AVAILABLE; UNAVAILABLE (503) when no version is AVAILABLE;
                a serving failure or the deadline as `OipError.from_serving`.
        """
        if not self.exposure.exposes(model_name):
            raise not_found(f"unknown model '{model_name}'")
        try:
            status = await self._model_status(model_name, deadline)
            available = tuple(sorted(v.version for v in status.versions if v.state == "AVAILABLE"))
            if not version:
                if not available:
                    states = ", ".join(f"{v.version}: {v.state}" for v in status.versions) or "none"
                    raise OipError(Code.UNAVAILABLE, f"model '{model_name}' has no version AVAILABLE ({states})")
                number, pinned = available[-1], False
                metadata = await self._model_metadata(model_name, number, deadline)
            elif version.isascii() and version.isdigit():
                number, pinned = int(version), True
                if number not in available:
                    raise not_found(f"model '{model_name}' has no version {version} AVAILABLE")
                metadata = await self._model_metadata(model_name, number, deadline)
            else:
                metadata = await self._label_metadata(model_name, version, deadline)
                number, pinned = metadata.version, False
        except ServingNotFound as exc:
            what = f"version '{version}' of model '{model_name}'" if version else f"model '{model_name}'"
            raise OipError(Code.NOT_FOUND, f"unknown {what}: {exc.message}", serving_code=exc.code) from exc
        except (ServingError, DeadlineExceeded) as exc:
            raise OipError.from_serving(exc) from exc
        return Resolved(model_name, number, pinned, available, metadata.signatures)

    async def ready(self, model_name: str, version: str | None, deadline: Deadline) -> bool:
        """Whether `model_name` (at `version`) has a version AVAILABLE to answer.

        Raises:
            OipError: NOT_FOUND (404) for a model not exposed, or one serving does not have.
        """
        try:
            await self.resolve(model_name, version, deadline)
        except OipError as exc:
            if exc.code is Code.NOT_FOUND and not self.exposure.exposes(model_name):
                raise
            if exc.code is Code.NOT_FOUND and not version:
                raise
            return False
        return True

    async def _model_status(self, model_name: str, deadline: Deadline) -> ModelStatus:
        status = self._status.get(model_name)
        if status is None:
            status = await self.client.model_status(model_name, deadline)
            self._status.put(model_name, status)
        return status

    async def _label_metadata(self, model_name: str, label: str, deadline: Deadline) -> ServedMetadata:
        """Metadata by version label. TF Serving answers a label models.config does not give
        INVALID_ARGUMENT ("Unrecognized servable version label"); for OIP that is a version the
        model has not: NOT_FOUND (404), as for an unknown version number."""
        try:
            return await self._model_metadata(model_name, label, deadline)
        except ServingError as exc:
            if exc.code is Code.INVALID_ARGUMENT:
                raise not_found(f"model '{model_name}' has no version label '{label}': {exc.message}") from exc
            raise

    async def _model_metadata(self, model_name: str, version: int | str, deadline: Deadline) -> ServedMetadata:
        key = (model_name, version)
        metadata = self._metadata.get(key)
        if metadata is None:
            metadata = await self.client.model_metadata(model_name, version, deadline)
            self._metadata.put(key, metadata)
        return metadata
