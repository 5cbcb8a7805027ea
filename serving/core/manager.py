"""The servable manager: which versions of which models are loaded, their states, and labels.

TF Serving's ``ServerCore`` (config, labels) + ``AspiredVersionsManager`` / ``BasicManager``
(loading, unloading, request handles) + ``ServableStateMonitor`` (the states the model-status API
reports), in one thread-safe object:

* **Config** -- :meth:`ServableManager.aspire` applies a ``ModelServerConfig`` without waiting:
  the label map is checked and replaced (:mod:`serving.core.version_labels`), the file-system source
  (:mod:`serving.sources.storage_path.file_system_storage_path_source`) is told which models to
  watch and polls them, and each model's aspired
  versions show up as ``START``. :meth:`ServableManager.reload_config` does the same and then waits
  like ``ServerCore::ReloadConfig``: it is the core of ``ModelService.HandleReloadConfigRequest``
  and of ``--model_config_file_poll_wait_seconds``.
* **Versions** -- the source hands over each model's full aspired set on every poll. A
  ``ManageState`` thread applies it (versions no longer aspired are marked so; new ones get a
  ``NEW`` harness), then asks :func:`~serving.core.aspired_version_policy.availability_preserving_policy`
  for the next action until there is none: a new version is loaded and ``AVAILABLE`` before the old
  one is unloaded. Loads run on ``max(1, --num_load_threads)`` threads; a failed load is retried
  ``--max_num_load_retries`` times, ``--load_retry_interval_micros`` apart (tenacity), unless the
  version stops being aspired; then it is ``END`` with the error while the other models keep
  serving. Unloads run on their own thread and wait for the requests still using the version.
* **Requests** -- :meth:`ServableManager.acquire` hands a request the servable for a
  :class:`~serving.apis.ModelSpec` (latest ``AVAILABLE`` version, a specific one, or a label's) and
  holds a reference on it until the request ends.

Lookup errors are TF Serving's: ``NOT_FOUND`` ``Servable not found for request: Latest(foo)`` /
``Specific(foo, 3)``, ``INVALID_ARGUMENT`` ``Unrecognized servable version label: x``,
``UNAVAILABLE`` ``Model labels does not init yet.x`` (before the first config).

Deliberate difference: TF Serving's first config blocks start-up until every model is loaded and
refuses to start if one fails (``N servable(s) did not become available``). Here the server answers
status requests while loading (``START``/``LOADING``) and a model that fails is ``END`` with its
error while the others serve; later config reloads wait as TF Serving's do.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import tenacity

from serving.apis import ModelSpec
from serving.config.model_server_config import validate_config
from serving.core import version_labels
from serving.core.aspired_version_policy import (
    Action,
    AspiredServableStateSnapshot,
    HarnessState,
    ServableAction,
    availability_preserving_policy,
    next_action,
)
from serving.core.servable_handle import ServableHandle
from serving.core.servable_state import ManagerState, ServableState
from serving.sources.storage_path import file_system_storage_path_source as source
from serving.util.errors import Code, ServingError, from_exception

if TYPE_CHECKING:
    from tensorflow_serving.config.model_server_config_pb2 import ModelServerConfig

__all__ = ["ServableManager"]

_log = logging.getLogger(__name__)


#: What the status API reports for each harness state.
_MANAGER_STATE: Mapping[HarnessState, ManagerState] = {
    HarnessState.NEW: ManagerState.START,
    HarnessState.LOADING: ManagerState.LOADING,
    HarnessState.READY: ManagerState.AVAILABLE,
    HarnessState.UNLOADING: ManagerState.UNLOADING,
    HarnessState.DISABLED: ManagerState.END,
    HarnessState.ERROR: ManagerState.END,
}


@dataclass(eq=False)
class _Harness:
    """``LoaderHarness``: one managed version of a model."""

    name: str
    version: int
    path: str
    state: HarnessState = HarnessState.NEW
    is_aspired: bool = True
    servable: Any = None
    refs: int = 0  # requests holding this version
    error: ServingError | None = None
    cancel_load_retry: threading.Event = field(default_factory=threading.Event)

    @property
    def servable_id(self) -> str:
        """``ServableId::DebugString()``."""
        return f"{{name: {self.name} version: {self.version}}}"


@dataclass
class _Model:
    """One model name: its managed versions and every version's last reported state."""

    harnesses: dict[int, _Harness] = field(default_factory=dict)
    states: dict[int, ServableState] = field(default_factory=dict)  # kept after unload (END)


class ServableManager:
    """Holds loaded servables per model name and version. Thread-safe.

    ``loader(path)`` loads one version directory and returns a servable with a ``close()`` method
    (in production :meth:`serving.servables.tensorflow.servable.Servable.load` plus warmup, see
    :mod:`serving.servables.tensorflow.saved_model_warmup`);
    it raises on failure. The keyword arguments are the flags of the same names (seconds instead
    of microseconds); the defaults suit a library user -- no retries, one file-system poll -- and
    the server passes TF Serving's.
    """

    def __init__(
        self,
        loader: Callable[[str], Any],
        *,
        allow_version_labels_for_unavailable_models: bool = False,
        file_system_poll_wait_seconds: int = 0,
        max_num_load_retries: int = 0,
        load_retry_interval_s: float = 0.0,
        num_load_threads: int = 0,
    ) -> None:
        self._loader = loader
        self._allow_unavailable_labels = allow_version_labels_for_unavailable_models
        self._file_system_poll_wait_seconds = file_system_poll_wait_seconds
        self._max_num_load_retries = max(0, max_num_load_retries)
        self._load_retry_interval_s = max(0.0, load_retry_interval_s)
        self._num_load_threads = max(1, num_load_threads)

        self._lock = threading.Lock()
        # Notified on every state change; waited on by the ManageState loop, config reloads and
        # unloads (for request references to drop).
        self._changed = threading.Condition(self._lock)
        self._models: dict[str, _Model] = {}
        self._pending: dict[str, dict[int, str]] = {}  # aspired-versions requests not applied
        self._labels: dict[str, dict[str, int]] | None = None
        self._stopping = False

        self._config_lock = threading.Lock()  # ServerCore::config_mu_: one config change at once
        self._config: ModelServerConfig | None = None
        self._source = source.FileSystemStoragePathSource(self._set_aspired_versions)
        self._manage_thread: threading.Thread | None = None
        self._load_pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._unload_pool: concurrent.futures.ThreadPoolExecutor | None = None

    # ---- configuration -------------------------------------------------------------------

    def aspire(self, config: ModelServerConfig) -> None:
        """Apply ``config`` without waiting for any load (``ServerCore::ReloadConfig`` up to its
        wait).

        Versions the source finds are ``START`` afterwards; they load once :meth:`start` (or
        :meth:`load_aspired`) runs the manager. Raises :class:`ServingError` like
        :meth:`reload_config`; on error nothing changes.
        """
        with self._config_lock:
            self._apply_config(config)

    def reload_config(self, config: ModelServerConfig) -> None:
        """Replace the served models with ``config``: ``ServerCore::ReloadConfig``. Blocking.

        The core of ``ModelService.HandleReloadConfigRequest`` and of the config-file poll. The new
        model list replaces the old one: models added are loaded, models removed are unloaded
        (once no request uses them), changed version policies and labels apply at once. Returns
        once every *added* model has an ``AVAILABLE`` version (on the first config: every model).
        Raises :class:`ServingError`, with TF Serving's codes and messages; on any error but the
        last, nothing changed:

        * ``FAILED_PRECONDITION`` ``Cannot transition to requested config. It is only legal to
          transition from one ModelConfigList to another.``
        * ``INVALID_ARGUMENT`` from :func:`serving.config.model_server_config.validate_config` (duplicate names,
          relative base paths, platform, custom config);
        * ``FAILED_PRECONDITION`` ``Request to assign label to version <v> of model <m>, which is
          not currently available for inference`` (see :mod:`serving.core.version_labels`);
        * ``UNKNOWN`` ``<n> model(s) did not become available: {{{name: m version: 1} due to
          error: <status>}, }`` -- the config *is* applied; the listed models failed to load;
        * ``UNAVAILABLE`` when the server shuts down meanwhile.

        An empty ``ModelServerConfig`` (no ``model_config_list`` at all) is a no-op before the first
        config ("Taking no action for empty config.") and refused after it;
        ``model_config_list {}`` removes every model. HandleReloadConfigRequest's own check (only a
        ``model_config_list`` is accepted: ``INVALID_ARGUMENT`` ``ServerModelConfig type not
        supported by HandleReloadConfigRequest. Only ModelConfigList is currently supported``)
        belongs to the RPC, not here. Unlike TF Serving, an added model with no version on disk
        does not block the call forever: it is logged and not awaited.
        """
        with self._config_lock:
            first = self._config is None
            unchanged = config == self._config
            added = self._apply_config(config)
            self.start()
            awaited = _model_names(config) if first else added
            self._wait_until_models_available(awaited)
        _log.log(logging.DEBUG if unchanged else logging.INFO, "Finished reloading config")

    def _apply_config(self, config: ModelServerConfig) -> set[str]:
        """Validate, replace labels and the source config; returns the names of added models.

        Caller holds ``_config_lock``.
        """
        if self._stopping:
            raise ServingError(Code.UNAVAILABLE, "The model server is shutting down")
        choice = config.WhichOneof("config")
        if self._config is not None and (
            self._config.WhichOneof("config") != "model_config_list"
            or choice != "model_config_list"
        ):
            raise ServingError(
                Code.FAILED_PRECONDITION,
                "Cannot transition to requested config. It is only legal to transition from one "
                "ModelConfigList to another.",
            )
        if choice is None:
            _log.info("Taking no action for empty config.")
            return set()
        validate_config(config)
        # The config-file poll re-applies an unchanged file every few seconds: only say so once.
        level = logging.DEBUG if config == self._config else logging.INFO
        old_names = _model_names(self._config) if self._config is not None else set()
        with self._lock:
            labels = version_labels.update_model_version_label_map(
                config,
                self._available_locked(),
                self._labels or {},
                allow_version_labels_for_unavailable_models=self._allow_unavailable_labels,
            )
            self._labels = labels
        self._config = config
        _log.log(level, "Adding/updating models.")
        for model in config.model_config_list.config:
            _log.log(level, " (Re-)adding model: %s", model.name)
        self._source.update_config(
            source.create_storage_path_source_config(config, self._file_system_poll_wait_seconds)
        )
        with self._lock:  # the versions found are START right away, whether running or not
            self._handle_pending_requests_locked()
        _log.log(level, "Finished adding/updating models")
        return _model_names(config) - old_names

    def _wait_until_models_available(self, names: Iterable[str]) -> None:
        """``ServerCore::WaitUntilModelsAvailable``: each model gets an AVAILABLE version, or all
        its aspired versions fail. Raises ``UNKNOWN`` naming the failures."""
        awaited = sorted(set(names))
        with self._lock:
            self._changed.wait_for(
                lambda: self._stopping or all(self._settled_locked(name) for name in awaited)
            )
            if self._stopping:
                raise ServingError(Code.UNAVAILABLE, "The model server is shutting down")
            failed: list[_Harness] = []
            for name in awaited:
                harnesses = self._aspired_locked(name)
                if not harnesses:
                    _log.warning("Model %s has no version to load; not waiting for it", name)
                elif all(h.state is HarnessState.ERROR for h in harnesses):
                    failed.append(max(harnesses, key=lambda h: h.version))
        if failed:
            entries = "".join(
                f"{{{h.servable_id} due to error: "
                f"{h.error.status_string() if h.error else 'UNKNOWN'}}}, "
                for h in failed
            )
            raise ServingError(
                Code.UNKNOWN, f"{len(failed)} model(s) did not become available: {{{entries}}}"
            )

    def _settled_locked(self, name: str) -> bool:
        """Whether ``name`` has an AVAILABLE aspired version or none left to try."""
        if name in self._pending:
            return False
        harnesses = self._aspired_locked(name)
        return any(h.state is HarnessState.READY for h in harnesses) or not any(
            h.state in (HarnessState.NEW, HarnessState.LOADING) for h in harnesses
        )

    def _aspired_locked(self, name: str) -> list[_Harness]:
        model = self._models.get(name)
        return [h for h in model.harnesses.values() if h.is_aspired] if model else []

    # ---- the ManageState loop ------------------------------------------------------------

    def start(self) -> None:
        """Start loading and unloading, and the periodic file-system poll. Idempotent."""
        with self._lock:
            if self._manage_thread is not None or self._stopping:
                return
            self._load_pool = concurrent.futures.ThreadPoolExecutor(
                self._num_load_threads, thread_name_prefix="servable-load"
            )
            self._unload_pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="servable-unload"
            )
            self._manage_thread = threading.Thread(
                target=self._manage_state,
                name="AspiredVersionsManager_ManageState_Thread",
                daemon=True,
            )
            self._manage_thread.start()
        self._source.start(self._file_system_poll_wait_seconds)

    def load_aspired(self) -> None:
        """Start the manager (if needed) and wait until every configured model's versions have
        loaded or failed, or the manager stops. Blocking; never raises for a failed load."""
        self.start()
        with self._lock:
            names = _model_names(self._config) if self._config is not None else set()
            self._changed.wait_for(
                lambda: self._stopping or all(self._settled_locked(name) for name in names)
            )

    def _set_aspired_versions(self, name: str, versions: Mapping[int, str]) -> None:
        """The source's callback (``EnqueueAspiredVersionsRequest``): the latest request wins."""
        with self._lock:
            self._pending[name] = dict(versions)
            self._changed.notify_all()

    def _manage_state(self) -> None:
        """``FlushServables`` + ``HandlePendingAspiredVersionsRequests`` +
        ``InvokePolicyAndExecuteAction``, whenever something changed."""
        with self._lock:
            while not self._stopping:
                self._flush_servables_locked()
                self._handle_pending_requests_locked()
                while (chosen := self._next_action_locked()) is not None:
                    self._perform_action_locked(*chosen)
                # A safety net only: every state change notifies.
                self._changed.wait(timeout=1.0)

    def _flush_servables_locked(self) -> None:
        """Stop managing versions that are no longer aspired and not loaded (new, unloaded or
        failed). Their last state stays visible in the model status."""
        for model in self._models.values():
            for version, harness in list(model.harnesses.items()):
                if harness.is_aspired or harness.state not in (
                    HarnessState.NEW, HarnessState.DISABLED, HarnessState.ERROR
                ):  # fmt: skip
                    continue
                del model.harnesses[version]
                if harness.state is HarnessState.NEW:  # never loaded: it ends here
                    self._publish_locked(harness, ServableState(ManagerState.END))

    def _handle_pending_requests_locked(self) -> None:
        """``ProcessAspiredVersionsRequest`` for every model with a pending request.

        A request that re-aspires a version still managed as not aspired (being unloaded, or
        failed) waits until that version is flushed, as in TF Serving.
        """
        for name, versions in list(self._pending.items()):
            model = self._models.setdefault(name, _Model())
            if any(
                not harness.is_aspired and version in versions
                for version, harness in model.harnesses.items()
            ):
                continue
            del self._pending[name]
            for version, harness in model.harnesses.items():
                if version not in versions and harness.is_aspired:
                    harness.is_aspired = False
                    harness.cancel_load_retry.set()
            for version in sorted(versions):
                if version not in model.harnesses:
                    harness = _Harness(name, version, versions[version])
                    model.harnesses[version] = harness
                    self._publish_locked(harness, ServableState(ManagerState.START))
            self._changed.notify_all()

    def _next_action_locked(self) -> tuple[str, ServableAction] | None:
        actions = []
        for name, model in self._models.items():
            snapshots = [
                AspiredServableStateSnapshot(h.version, h.state, h.is_aspired)
                for h in model.harnesses.values()
            ]
            action = availability_preserving_policy(snapshots)
            if action is not None and not (action.action is Action.LOAD and self._stopping):
                actions.append((name, action))
        return next_action(actions)

    def _perform_action_locked(self, name: str, action: ServableAction) -> None:
        harness = self._models[name].harnesses[action.version]
        assert self._load_pool is not None and self._unload_pool is not None
        if action.action is Action.LOAD:
            self._set_state_locked(harness, HarnessState.LOADING)
            self._load_pool.submit(self._load, harness)
        else:
            self._set_state_locked(harness, HarnessState.UNLOADING)
            self._unload_pool.submit(self._unload, harness)

    def _load(self, harness: _Harness) -> None:
        """``LoaderHarness::Load`` with retries, on a load thread."""
        _log.info("Loading servable version %s", harness.servable_id)
        try:
            servable = self._load_with_retries(harness)
        except Exception as exc:  # noqa: BLE001 - any load failure ends this version only
            error = from_exception(exc)
            _log.error(
                "Servable %s cannot be loaded: %s", harness.servable_id, error.status_string()
            )
            with self._lock:
                harness.error = error
                self._set_state_locked(harness, HarnessState.ERROR, error)
            return
        with self._lock:
            harness.servable = servable
            self._set_state_locked(harness, HarnessState.READY)
        _log.info("Successfully loaded servable version %s", harness.servable_id)

    def _load_with_retries(self, harness: _Harness) -> Any:
        description = f"Loading servable: {harness.servable_id}"

        def attempt() -> Any:
            if harness.cancel_load_retry.is_set():
                raise ServingError(Code.CANCELLED, "Loading of servable cancelled")
            try:
                return self._loader(harness.path)
            except Exception as exc:
                _log.error("%s failed: %s", description, from_exception(exc).status_string())
                raise

        def log_retry(state: tenacity.RetryCallState) -> None:
            _log.info("Retrying of %s retry: %d", description, state.attempt_number)

        def sleep(seconds: float) -> None:
            harness.cancel_load_retry.wait(seconds)  # returns early once the load is cancelled

        retrying = tenacity.Retrying(
            stop=tenacity.stop_after_attempt(self._max_num_load_retries + 1),
            wait=tenacity.wait_fixed(self._load_retry_interval_s),
            # No retry once the version is no longer aspired (or the server stops): the sleep
            # below returns early then, and the next attempt raises CANCELLED.
            retry=tenacity.retry_if_exception(lambda _: not harness.cancel_load_retry.is_set()),
            sleep=sleep,
            before_sleep=log_retry,
            reraise=True,
        )
        return retrying(attempt)

    def _unload(self, harness: _Harness) -> None:
        """Wait for the requests holding ``harness``, close it: ``UNLOADING`` -> ``END``."""
        _log.info("Unloading servable version %s", harness.servable_id)
        with self._lock:
            self._changed.wait_for(lambda: harness.refs == 0 or self._stopping)
            if harness.refs:  # shutting down: unload_all() waits, with its timeout
                return
            servable, harness.servable = harness.servable, None
        _close(harness, servable)
        with self._lock:
            self._set_state_locked(harness, HarnessState.DISABLED)
        _log.info("Done unloading servable version %s", harness.servable_id)

    def _set_state_locked(
        self, harness: _Harness, state: HarnessState, health: ServingError | None = None
    ) -> None:
        harness.state = state
        self._publish_locked(harness, ServableState(_MANAGER_STATE[state], health))

    def _publish_locked(self, harness: _Harness, state: ServableState) -> None:
        """``ServableStateMonitor``: record the version's state for the status API."""
        self._models.setdefault(harness.name, _Model()).states[harness.version] = state
        self._changed.notify_all()

    def stop_loading(self) -> None:
        """Stop polling and loading (used at shutdown): pending loads and retries are cancelled,
        config reloads that wait return ``UNAVAILABLE``; a load under way completes."""
        with self._lock:
            self._stopping = True
            for model in self._models.values():
                for harness in model.harnesses.values():
                    harness.cancel_load_retry.set()
            self._changed.notify_all()
        self._source.stop()

    # ---- requests --------------------------------------------------------------------------

    @contextlib.contextmanager
    def acquire(self, spec: ModelSpec) -> Iterator[ServableHandle]:
        """The servable for ``spec``, referenced until the ``with`` block ends.

        ``ServerCore::GetServableHandle``: no version -> the highest AVAILABLE version; a label ->
        its version. Raises :class:`ServingError` (see module doc).
        """
        harness, handle = self._acquire(spec)
        try:
            yield handle
        finally:
            with self._lock:
                harness.refs -= 1
                if harness.refs == 0 and harness.state is HarnessState.UNLOADING:
                    self._changed.notify_all()

    def _acquire(self, spec: ModelSpec) -> tuple[_Harness, ServableHandle]:
        if not spec.name:
            raise ServingError(Code.INVALID_ARGUMENT, "ModelSpec has no name specified.")
        with self._lock:
            version = spec.version
            if spec.version_label is not None:
                version = self._version_for_label(spec.name, spec.version_label)
            model = self._models.get(spec.name)
            chosen: _Harness | None = None
            if model is not None:
                if version is None:
                    ready = [
                        h for h in model.harnesses.values() if h.state is HarnessState.READY
                    ]
                    chosen = max(ready, key=lambda h: h.version) if ready else None
                else:
                    harness = model.harnesses.get(version)
                    if harness is not None and harness.state is HarnessState.READY:
                        chosen = harness
            if chosen is not None:
                chosen.refs += 1
                return chosen, ServableHandle(chosen.name, chosen.version, chosen.servable)
            request = ModelSpec(spec.name, version=version).debug_string()
            raise ServingError(Code.NOT_FOUND, f"Servable not found for request: {request}")

    def _version_for_label(self, name: str, label: str) -> int:
        """``ServerCore::GetModelVersionForLabel`` (caller holds the lock)."""
        if self._labels is None:
            raise ServingError(Code.UNAVAILABLE, f"Model labels does not init yet.{label}")
        version = self._labels.get(name, {}).get(label)
        if version is None:
            raise ServingError(
                Code.INVALID_ARGUMENT, f"Unrecognized servable version label: {label}"
            )
        return version

    def version_states(self, name: str) -> dict[int, ServableState]:
        """Every version of ``name`` ever managed and its last state, latest first
        (``ServableStateMonitor::GetVersionStates``)."""
        with self._lock:
            model = self._models.get(name)
            if model is None:
                return {}
            return dict(sorted(model.states.items(), reverse=True))

    def available_versions(self) -> dict[str, list[int]]:
        """Model name -> AVAILABLE versions, latest first, for every configured model."""
        with self._lock:
            names = _model_names(self._config) if self._config is not None else set()
            available = self._available_locked()
            return {name: sorted(available.get(name, ()), reverse=True) for name in sorted(names)}

    def _available_locked(self) -> dict[str, set[int]]:
        return {
            name: {v for v, h in model.harnesses.items() if h.state is HarnessState.READY}
            for name, model in self._models.items()
        }

    # ---- shutdown --------------------------------------------------------------------------

    def unload_all(self, timeout: float | None = None) -> None:
        """Stop managing and unload every version: ``UNLOADING``, wait up to ``timeout`` seconds
        for in-flight requests, close, ``END``. A load under way finishes first."""
        self.stop_loading()
        if self._manage_thread is not None:
            self._manage_thread.join()
        for pool in (self._load_pool, self._unload_pool):
            if pool is not None:
                pool.shutdown(wait=True)
        with self._lock:
            loaded = [
                harness
                for model in self._models.values()
                for harness in model.harnesses.values()
                if harness.servable is not None
            ]
            for harness in loaded:
                self._set_state_locked(harness, HarnessState.UNLOADING)
            self._changed.wait_for(lambda: all(h.refs == 0 for h in loaded), timeout=timeout)
            to_close = [(harness, harness.servable) for harness in loaded]
            for harness in loaded:
                harness.servable = None
        for harness, servable in to_close:
            _close(harness, servable)
        with self._lock:
            for model in self._models.values():
                for harness in model.harnesses.values():
                    if harness.state is not HarnessState.ERROR:
                        self._set_state_locked(harness, HarnessState.DISABLED)


def _close(harness: _Harness, servable: Any) -> None:
    if servable is None:
        return
    try:
        servable.close()
    except Exception:  # noqa: BLE001 - closing one must not stop the others
        _log.exception("Unloading servable version %s failed", harness.servable_id)


def _model_names(config: ModelServerConfig) -> set[str]:
    return {model.name for model in config.model_config_list.config}
