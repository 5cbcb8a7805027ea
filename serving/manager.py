"""The servable manager: which versions of which models are loaded, and their lifecycle states.

TF Serving's ``AspiredVersionsManager`` + ``ServableStateMonitor`` + the label map of
``ServerCore``, reduced to what a statically configured server needs for now:

* :meth:`ServableManager.aspire` reads each model's versions from its source
  (:mod:`serving.source`) and marks the ones its version policy wants as ``START``;
* :meth:`ServableManager.load_aspired` loads them (``LOADING`` -> ``AVAILABLE``, or ``END`` with the
  error as the version's health -- the other models keep serving), then installs version labels;
* :meth:`ServableManager.acquire` hands a request the servable for a
  :class:`~serving.apis.ModelSpec` (latest available version, a specific one, or a label's) and
  holds a reference on it until the request ends; :meth:`ServableManager.unload_all` waits for
  those references before closing Sessions.

Lookup errors are TF Serving's: ``NOT_FOUND`` ``Servable not found for request: Latest(foo)`` /
``Specific(foo, 3)``, ``INVALID_ARGUMENT`` ``Unrecognized servable version label: x``,
``UNAVAILABLE`` ``Model labels does not init yet.x`` (before the first load finished).
"""

from __future__ import annotations

import contextlib
import enum
import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from serving import source
from serving.apis import ModelSpec
from serving.errors import Code, ServingError, from_exception

if TYPE_CHECKING:
    from serving.config import ModelServerConfig

__all__ = ["ManagerState", "ServableHandle", "ServableManager", "ServableState"]

_log = logging.getLogger(__name__)


class ManagerState(enum.IntEnum):
    """Lifecycle of one servable version: ``ServableState::ManagerState``.

    The numbers are those of ``ModelVersionStatus.State`` in get_model_status.proto, which the
    model-status endpoint reports.
    """

    START = 10  # aspired (on disk, wanted by the version policy); not loading yet
    LOADING = 20  # the SavedModel is being read and its Session restored
    AVAILABLE = 30  # loaded; requests are served from it
    UNLOADING = 40  # being torn down: no new requests reach it, in-flight ones finish first
    END = 50  # gone: unloaded, or its load failed (``health`` then holds the error)


@dataclass(frozen=True)
class ServableState:
    """A version's state and health (``None`` = OK), as ``GetModelStatus`` reports it."""

    state: ManagerState
    health: ServingError | None = None


@dataclass(frozen=True)
class ServableHandle:
    """The servable a request runs on, pinned for the request's duration."""

    name: str
    version: int
    servable: Any  # serving.servable.Servable (not imported: this module stays TensorFlow-free)


@dataclass
class _Model:
    """Everything the manager knows about one configured model."""

    name: str
    paths: dict[int, str]  # aspired version -> directory
    label_config: dict[str, int]  # ModelConfig.version_labels
    states: dict[int, ServableState] = field(default_factory=dict)
    servables: dict[int, Any] = field(default_factory=dict)
    refs: dict[int, int] = field(default_factory=dict)  # in-flight requests per version
    labels: dict[str, int] = field(default_factory=dict)  # installed labels


class ServableManager:
    """Holds loaded servables per model name and version. Thread-safe.

    ``loader(path)`` loads one version directory and returns a servable with a ``close()``
    method (in production :meth:`serving.servable.Servable.load` with the server's options);
    it raises on failure.
    """

    def __init__(
        self,
        loader: Callable[[str], Any],
        *,
        allow_version_labels_for_unavailable_models: bool = False,
    ) -> None:
        self._loader = loader
        self._allow_unavailable_labels = allow_version_labels_for_unavailable_models
        self._models: dict[str, _Model] = {}
        self._labels_ready = False
        self._stopping = False
        self._lock = threading.Lock()
        self._released = threading.Condition(self._lock)

    # ---- configuration and loading -------------------------------------------------------

    def aspire(self, config: ModelServerConfig) -> None:
        """Find each configured model's versions and mark the aspired ones ``START``.

        Only reads directories; a missing base path is logged (TF Serving keeps polling for it)
        and the model then has no versions.
        """
        models: dict[str, _Model] = {}
        for model_config in config.model_config_list.config:
            try:
                on_disk = source.list_versions(model_config.name, model_config.base_path)
            except ServingError as exc:
                _log.warning("File system storage path source: %s", exc.message)
                on_disk = {}
            aspired = source.select_versions(model_config.model_version_policy, on_disk)
            model = _Model(
                name=model_config.name,
                paths={version: on_disk[version] for version in aspired},
                label_config=dict(model_config.version_labels),
            )
            model.states = {version: ServableState(ManagerState.START) for version in aspired}
            models[model.name] = model
        with self._lock:
            self._models = models

    def load_aspired(self) -> None:
        """Load every ``START`` version (latest first), then install version labels. Blocking."""
        for model in list(self._models.values()):
            for version in sorted(model.paths, reverse=True):
                if self._stopping:
                    return
                self._load_version(model, version)
        self._install_labels()

    def _load_version(self, model: _Model, version: int) -> None:
        servable_id = f"{{name: {model.name} version: {version}}}"
        self._set_state(model, version, ServableState(ManagerState.LOADING))
        try:
            servable = self._loader(model.paths[version])
        except Exception as exc:  # noqa: BLE001 - any load failure ends this version only
            error = from_exception(exc)
            _log.error("Loading servable: %s failed: %s", servable_id, error.status_string())
            self._set_state(model, version, ServableState(ManagerState.END, error))
            return
        with self._lock:
            model.servables[version] = servable
            model.refs[version] = 0
            model.states[version] = ServableState(ManagerState.AVAILABLE)
        _log.info("Successfully loaded servable version %s", servable_id)

    def _install_labels(self) -> None:
        """``UpdateModelVersionLabelMap``: a label may only name an AVAILABLE version.

        A label naming another version is refused with TF Serving's message (logged; TF Serving
        rejects the whole config instead) and requests using it get ``Unrecognized servable
        version label``.
        """
        with self._lock:
            for model in self._models.values():
                for label, version in model.label_config.items():
                    state = model.states.get(version)
                    if self._allow_unavailable_labels or (
                        state is not None and state.state is ManagerState.AVAILABLE
                    ):
                        model.labels[label] = version
                    else:
                        _log.error(
                            "Request to assign label to version %d of model %s, which is not "
                            "currently available for inference",
                            version,
                            model.name,
                        )
            self._labels_ready = True

    def _set_state(self, model: _Model, version: int, state: ServableState) -> None:
        with self._lock:
            model.states[version] = state

    def stop_loading(self) -> None:
        """Skip versions not yet loading (used at shutdown); a load under way completes."""
        self._stopping = True

    # ---- requests --------------------------------------------------------------------------

    @contextlib.contextmanager
    def acquire(self, spec: ModelSpec) -> Iterator[ServableHandle]:
        """The servable for ``spec``, referenced until the ``with`` block ends.

        ``ServerCore::GetServableHandle``: no version -> the highest AVAILABLE version; a label ->
        its version. Raises :class:`ServingError` (see module doc).
        """
        handle = self._acquire(spec)
        try:
            yield handle
        finally:
            with self._lock:
                refs = self._models[handle.name].refs
                refs[handle.version] -= 1
                if refs[handle.version] == 0:
                    self._released.notify_all()

    def _acquire(self, spec: ModelSpec) -> ServableHandle:
        if not spec.name:
            raise ServingError(Code.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        with self._lock:
            version = spec.version
            if spec.version_label is not None:
                version = self._version_for_label(spec.name, spec.version_label)
            model = self._models.get(spec.name)
            if model is not None:
                if version is None:
                    available = [
                        v for v, s in model.states.items() if s.state is ManagerState.AVAILABLE
                    ]
                    version = max(available) if available else None
                    chosen = version
                else:
                    state = model.states.get(version)
                    chosen = version if state and state.state is ManagerState.AVAILABLE else None
                if chosen is not None:
                    model.refs[chosen] += 1
                    return ServableHandle(spec.name, chosen, model.servables[chosen])
            request = ModelSpec(spec.name, version=version).debug_string()
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {request}")

    def _version_for_label(self, name: str, label: str) -> int:
        """``ServerCore::GetModelVersionForLabel`` (caller holds the lock)."""
        if not self._labels_ready:
            raise ServingError(Code.UNAVAILABLE, f"Model labels does not init yet.{label}")
        model = self._models.get(name)
        if model is not None and label in model.labels:
            return model.labels[label]
        raise ServingError(Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}")

    def version_states(self, name: str) -> dict[int, ServableState]:
        """Every known version of ``name`` and its state, latest first (``GetVersionStates``)."""
        with self._lock:
            model = self._models.get(name)
            if model is None:
                return {}
            return dict(sorted(model.states.items(), reverse=True))

    def available_versions(self) -> dict[str, list[int]]:
        """Model name -> AVAILABLE versions (for start-up logging)."""
        with self._lock:
            return {
                name: sorted(
                    (v for v, s in model.states.items() if s.state is ManagerState.AVAILABLE),
                    reverse=True,
                )
                for name, model in self._models.items()
            }

    # ---- shutdown --------------------------------------------------------------------------

    def unload_all(self, timeout: float | None = None) -> None:
        """Unload every version: ``UNLOADING``, wait for in-flight requests, close, ``END``."""
        self.stop_loading()
        with self._lock:
            for model in self._models.values():
                for version in model.servables:
                    model.states[version] = ServableState(ManagerState.UNLOADING)
            self._released.wait_for(
                lambda: all(
                    count == 0 for model in self._models.values() for count in model.refs.values()
                ),
                timeout=timeout,
            )
            to_close = [
                (model, version, servable)
                for model in self._models.values()
                for version, servable in model.servables.items()
            ]
            for model, version, _ in to_close:
                del model.servables[version]
        for model, version, servable in to_close:
            try:
                servable.close()
            except Exception:  # noqa: BLE001 - closing one must not stop the others
                _log.exception("Unloading servable %s version %d failed", model.name, version)
            self._set_state(model, version, ServableState(ManagerState.END))
