"""Versions, labels and config reloads: the policy and label tables, the file-system source, the
periodic poll, and the manager driving them with a fake loader (no TensorFlow).

The manager tests use real version directories under ``tmp_path``; a re-poll is triggered by
applying the same config again (:meth:`ServableManager.aspire`), which polls at once, so nothing
waits for the 1-second poll except the one test of the periodic poll itself.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from google.protobuf import text_format

from serving.apis import ModelSpec
from serving.config.model_server_config import ModelServerConfig
from serving.core.aspired_version_policy import (
    Action,
    AspiredServableStateSnapshot,
    HarnessState,
    ServableAction,
    availability_preserving_policy,
    next_action,
)
from serving.core.manager import ServableManager
from serving.core.servable_state import ManagerState
from serving.core.version_labels import update_model_version_label_map
from serving.model_servers.config_reloader import poll_filesystem_and_reload_config
from serving.sources.storage_path import file_system_storage_path_source as source
from serving.util.errors import Code, ServingError
from serving.util.periodic_function import PeriodicFunction
from tests.support import wait_until

WAIT_S = 10.0

NEW, LOADING, READY = HarnessState.NEW, HarnessState.LOADING, HarnessState.READY
UNLOADING, DISABLED, ERROR = HarnessState.UNLOADING, HarnessState.DISABLED, HarnessState.ERROR


# ---- AvailabilityPreservingPolicy -----------------------------------------------------------


def snapshot(version: int, state: HarnessState, aspired: bool) -> AspiredServableStateSnapshot:
    return AspiredServableStateSnapshot(version, state, aspired)


def load(version: int) -> ServableAction:
    return ServableAction(Action.LOAD, version)


def unload(version: int) -> ServableAction:
    return ServableAction(Action.UNLOAD, version)


@pytest.mark.parametrize(
    ("versions", "expected"),
    [
        pytest.param([], None, id="nothing-managed"),
        pytest.param([(1, NEW, True)], load(1), id="load-new"),
        pytest.param([(1, NEW, True), (2, NEW, True)], load(2), id="load-highest-first"),
        pytest.param([(3, READY, True), (1, NEW, True)], load(1), id="all-policy-older-version"),
        pytest.param([(1, READY, True), (2, READY, True)], None, id="steady"),
        pytest.param([(1, READY, False), (2, NEW, True)], load(2), id="swap-keeps-old-loads-new"),
        pytest.param([(1, READY, False), (2, LOADING, True)], None, id="swap-waits-for-new"),
        pytest.param([(1, READY, False), (2, READY, True)], unload(1), id="swap-unloads-old"),
        pytest.param([(1, READY, False), (2, ERROR, True)], None, id="failed-new-keeps-old"),
        pytest.param([(1, READY, False)], unload(1), id="model-removed"),
        pytest.param([(2, READY, False), (1, READY, False)], unload(1), id="removed-lowest-first"),
        pytest.param(
            [(1, READY, False), (2, READY, False), (3, NEW, True)],
            unload(1),
            id="two-unaspired-serving",
        ),
        pytest.param([(1, UNLOADING, False), (2, READY, True)], None, id="unload-under-way"),
        pytest.param([(1, NEW, False)], None, id="unaspired-new-is-flushed-not-loaded"),
        pytest.param([(1, ERROR, True)], None, id="failed-is-not-retried-by-policy"),
        pytest.param([(1, DISABLED, False), (2, READY, True)], None, id="unloaded"),
        pytest.param(
            [(1, READY, False), (2, READY, True), (3, NEW, True)],
            unload(1),
            id="unload-before-load",
        ),
    ],
)
def test_availability_preserving_policy(
    versions: list[tuple[int, HarnessState, bool]], expected: ServableAction | None
) -> None:
    assert availability_preserving_policy(snapshot(*v) for v in versions) == expected


@pytest.mark.parametrize(
    ("actions", "expected"),
    [
        ([], None),
        ([("a", None), ("b", None)], None),
        ([("a", load(1)), ("b", unload(2))], ("b", unload(2))),
        ([("a", load(1)), ("b", load(2))], ("a", load(1))),
        ([("a", None), ("b", load(3))], ("b", load(3))),
    ],
)
def test_next_action_prefers_unloads(
    actions: list[tuple[str, ServableAction | None]], expected: tuple[str, ServableAction] | None
) -> None:
    assert next_action(actions) == expected


# ---- version labels --------------------------------------------------------------------------


def parse_config(text: str) -> ModelServerConfig:
    return text_format.Parse(text, ModelServerConfig())


def labels_config(labels: dict[str, int]) -> ModelServerConfig:
    entries = " ".join(f'version_labels {{ key: "{k}" value: {v} }}' for k, v in labels.items())
    return parse_config(
        f'model_config_list {{ config {{ name: "m" base_path: "/m" model_platform: "tensorflow" '
        f"{entries} }} }}"
    )


def refused(version: int) -> str:
    return (
        f"Request to assign label to version {version} of model m, which is not currently "
        "available for inference"
    )


@pytest.mark.parametrize(
    ("labels", "available", "current", "allow", "expected"),
    [
        pytest.param({}, set(), {}, False, {}, id="no-labels"),
        pytest.param({"stable": 1}, {1}, {}, False, {"m": {"stable": 1}}, id="available"),
        pytest.param({"stable": 1}, set(), {}, False, refused(1), id="startup-without-flag"),
        pytest.param({"stable": 1}, set(), {}, True, {"m": {"stable": 1}}, id="startup-flag"),
        pytest.param(
            {"stable": 2}, {1, 2}, {"stable": 1}, False, {"m": {"stable": 2}}, id="move-available"
        ),
        pytest.param({"stable": 2}, {1}, {"stable": 1}, False, refused(2), id="move-unavailable"),
        pytest.param(
            {"stable": 2}, {1}, {"stable": 1}, True, refused(2), id="flag-never-moves-to-unloaded"
        ),
        pytest.param(
            {"stable": 1}, set(), {"stable": 1}, True, {"m": {"stable": 1}}, id="flag-keeps-label"
        ),
        pytest.param(
            {"stable": 1, "canary": 3},
            {1},
            {"stable": 1},
            True,
            {"m": {"stable": 1, "canary": 3}},
            id="flag-new-label",
        ),
    ],
)
def test_update_model_version_label_map(
    labels: dict[str, int],
    available: set[int],
    current: dict[str, int],
    allow: bool,
    expected: dict[str, dict[str, int]] | str,
) -> None:
    def compute() -> dict[str, dict[str, int]]:
        return update_model_version_label_map(
            labels_config(labels),
            {"m": available},
            {"m": current},
            allow_version_labels_for_unavailable_models=allow,
        )

    if isinstance(expected, str):
        with pytest.raises(ServingError) as info:
            compute()
        assert (info.value.code, info.value.message) == (Code.FAILED_PRECONDITION, expected)
    else:
        assert compute() == expected


# ---- the file-system source and the periodic poll --------------------------------------------


def model_config(root: Path, *names: str, extra: str = "") -> ModelServerConfig:
    entries = "".join(
        f'config {{ name: "{name}" base_path: "{root / name}" model_platform: "tensorflow" '
        f"{extra} }} "
        for name in names
    )
    return parse_config(f"model_config_list {{ {entries}}}")


def add_versions(root: Path, name: str, *versions: int) -> None:
    for version in versions:
        (root / name / str(version)).mkdir(parents=True)


class Emitted:
    """Records the source's aspired-versions callbacks."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, dict[int, str]]] = []
        self.lock = threading.Lock()

    def __call__(self, name: str, versions: dict[int, str]) -> None:
        with self.lock:
            self.calls.append((name, dict(versions)))

    def last(self, name: str) -> dict[int, str] | None:
        with self.lock:
            found = [versions for called, versions in self.calls if called == name]
        return found[-1] if found else None


def test_source_emits_each_servables_aspired_set(tmp_path: Path) -> None:
    add_versions(tmp_path, "a", 1, 2, 3)
    add_versions(tmp_path, "b", 1, 2)
    emitted = Emitted()
    fs_source = source.FileSystemStoragePathSource(emitted)
    config = model_config(tmp_path, "a")
    config.model_config_list.config.MergeFrom(
        model_config(tmp_path, "b", extra="model_version_policy { all {} }")
        .model_config_list.config
    )
    fs_source.update_config(source.create_storage_path_source_config(config, 1))
    assert emitted.last("a") == {3: str(tmp_path / "a" / "3")}
    assert emitted.last("b") == {2: str(tmp_path / "b" / "2"), 1: str(tmp_path / "b" / "1")}
    # A servable dropped from the config gets an empty set: all its versions are unaspired.
    only_a = source.create_storage_path_source_config(model_config(tmp_path, "a"), 1)
    fs_source.update_config(only_a)
    assert emitted.last("b") == {}


def test_source_skips_a_missing_base_path_and_logs_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    add_versions(tmp_path, "a", 1)
    emitted = Emitted()
    fs_source = source.FileSystemStoragePathSource(emitted)
    config = model_config(tmp_path, "absent", "a")
    with caplog.at_level(logging.WARNING, logger="serving.sources.storage_path.file_system_storage_path_source"):
        fs_source.update_config(source.create_storage_path_source_config(config, 1))
        fs_source.poll()
    assert emitted.last("absent") is None  # nothing emitted: its versions stay as they are
    assert emitted.last("a") == {1: str(tmp_path / "a" / "1")}
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert errors == [
        "FileSystemStoragePathSource encountered a filesystem access error: Could not find base "
        f"path {tmp_path / 'absent'} for servable absent"
    ]


def test_source_warns_about_missing_specific_versions_and_no_versions(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    add_versions(tmp_path, "s", 1)
    (tmp_path / "e").mkdir()
    emitted = Emitted()
    fs_source = source.FileSystemStoragePathSource(emitted)
    specific = "model_version_policy { specific { versions: 1 versions: 5 } }"
    config = model_config(tmp_path, "s", extra=specific)
    config.model_config_list.config.MergeFrom(model_config(tmp_path, "e").model_config_list.config)
    with caplog.at_level(logging.WARNING, logger="serving.sources.storage_path.file_system_storage_path_source"):
        fs_source.update_config(source.create_storage_path_source_config(config, 1))
        fs_source.poll()
    assert emitted.last("s") == {1: str(tmp_path / "s" / "1")}
    assert emitted.last("e") == {}
    warnings = [r.getMessage() for r in caplog.records]
    assert warnings == [
        "Version 5 of servable s, which was requested to be served as a 'specific' version in "
        "the servable's version policy, was not found in the file system",
        f"No versions of servable e found under base path {tmp_path / 'e'}. Did you forget to "
        "name your leaf directory as a number (eg. '/1/')?",
    ]


def test_duplicate_version_spellings_last_one_wins(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    add_versions(tmp_path, "m", 1)
    (tmp_path / "m" / "01").mkdir()
    with caplog.at_level(logging.WARNING, logger="serving.sources.storage_path.file_system_storage_path_source"):
        versions = source.list_versions("m", str(tmp_path / "m"))
    assert versions == {1: str(tmp_path / "m" / "1")}
    assert (
        "Duplicate version directories detected. Version 1 will be loaded from 1, 01 will be "
        "ignored." in caplog.text
    )


def test_source_polls_periodically(tmp_path: Path) -> None:
    add_versions(tmp_path, "m", 1)
    emitted = Emitted()
    fs_source = source.FileSystemStoragePathSource(emitted)
    config = source.create_storage_path_source_config(model_config(tmp_path, "m"), 1)
    fs_source.update_config(config)
    fs_source.start(1)
    try:
        add_versions(tmp_path, "m", 2)
        wait_until(lambda: emitted.last("m") == {2: str(tmp_path / "m" / "2")}, WAIT_S, "version 2")
    finally:
        fs_source.stop()


def test_periodic_function_keeps_going_after_an_error_and_stops_at_once() -> None:
    calls: list[float] = []

    def flaky() -> None:
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("first call fails")

    function = PeriodicFunction(flaky, 0.01, name="test-periodic")
    function.start()
    wait_until(lambda: len(calls) >= 3, WAIT_S, "three calls")
    function.stop()  # joins the thread: no call can follow
    assert not function._thread.is_alive()

    idle = PeriodicFunction(lambda: None, 3600, name="test-idle", initial_delay_s=3600)
    idle.start()
    idle.stop(timeout_s=WAIT_S)  # interrupts the hour-long wait
    assert not idle._thread.is_alive()
    with pytest.raises(ValueError):
        PeriodicFunction(lambda: None, 0, name="bad")


# ---- the manager with a fake loader ----------------------------------------------------------


class FakeServable:
    def __init__(self, path: str) -> None:
        self.path = path
        self.closed = False

    def close(self) -> None:
        self.closed = True


class FakeLoader:
    """Loads any directory; ``gates[path]`` blocks a load until set; ``failures[path]`` makes
    that many attempts fail first (-1: all)."""

    def __init__(self) -> None:
        self.gates: dict[str, threading.Event] = {}
        self.failures: dict[str, int] = {}
        self.attempts: dict[str, int] = {}
        self.loaded: list[FakeServable] = []
        self.lock = threading.Lock()

    def gate(self, path: Path) -> threading.Event:
        event = threading.Event()
        self.gates[str(path)] = event
        return event

    def __call__(self, path: str) -> FakeServable:
        with self.lock:
            self.attempts[path] = self.attempts.get(path, 0) + 1
            attempt = self.attempts[path]
        if path in self.gates:
            assert self.gates[path].wait(WAIT_S), f"gate of {path} never opened"
        failures = self.failures.get(path, 0)
        if failures < 0 or attempt <= failures:
            raise ServingError(Code.NOT_FOUND, f"cannot load {path} (attempt {attempt})")
        servable = FakeServable(path)
        with self.lock:
            self.loaded.append(servable)
        return servable


def state_of(manager: ServableManager, name: str, version: int) -> ManagerState | None:
    state = manager.version_states(name).get(version)
    return state.state if state else None


def wait_state(manager: ServableManager, name: str, version: int, state: ManagerState) -> None:
    wait_until(
        lambda: state_of(manager, name, version) is state,
        WAIT_S,
        f"{name} v{version} {state.name} (now {state_of(manager, name, version)})",
    )


def served_version(manager: ServableManager, spec: ModelSpec) -> int:
    with manager.acquire(spec) as handle:
        return handle.version


@pytest.fixture
def loader() -> FakeLoader:
    return FakeLoader()


@pytest.fixture
def make_manager(loader: FakeLoader) -> Iterator[Callable[..., ServableManager]]:
    managers: list[ServableManager] = []

    def make(**kwargs: object) -> ServableManager:
        manager = ServableManager(loader, **kwargs)  # type: ignore[arg-type]
        managers.append(manager)
        return manager

    yield make
    for manager in managers:
        manager.unload_all(timeout=WAIT_S)


def test_new_version_is_available_before_the_old_one_is_unloaded(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1)
    config = model_config(tmp_path, "m")
    manager = make_manager()
    manager.reload_config(config)
    assert served_version(manager, ModelSpec("m")) == 1

    gate = loader.gate(tmp_path / "m" / "2")
    add_versions(tmp_path, "m", 2)
    with manager.acquire(ModelSpec("m")) as in_flight:  # a request on v1 during the swap
        manager.aspire(config)  # polls: v2 is aspired, v1 no longer
        wait_state(manager, "m", 2, ManagerState.LOADING)
        assert state_of(manager, "m", 1) is ManagerState.AVAILABLE
        assert served_version(manager, ModelSpec("m")) == 1  # still served while v2 loads
        gate.set()
        wait_state(manager, "m", 2, ManagerState.AVAILABLE)
        wait_state(manager, "m", 1, ManagerState.UNLOADING)  # waits for the request above
        assert served_version(manager, ModelSpec("m")) == 2
        assert not in_flight.servable.closed
    wait_state(manager, "m", 1, ManagerState.END)
    assert in_flight.servable.closed
    with pytest.raises(ServingError, match=r"Specific\(m, 1\)"):
        served_version(manager, ModelSpec("m", version=1))


def test_a_failed_new_version_keeps_the_old_one_serving(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1)
    config = model_config(tmp_path, "m")
    manager = make_manager()
    manager.reload_config(config)
    loader.failures[str(tmp_path / "m" / "2")] = -1
    add_versions(tmp_path, "m", 2)
    manager.aspire(config)
    wait_state(manager, "m", 2, ManagerState.END)
    failed = manager.version_states("m")[2]
    assert failed.health is not None and failed.health.code is Code.NOT_FOUND
    assert state_of(manager, "m", 1) is ManagerState.AVAILABLE
    assert served_version(manager, ModelSpec("m")) == 1
    # TF Serving's AspiredVersionsManager defers a request that re-aspires a version it still
    # manages as un-aspired (v1) until that version is gone -- which availability preservation
    # never does while v2 is not READY. So v1 simply keeps serving; a v3 replaces both.
    shutil.rmtree(tmp_path / "m" / "2")
    manager.aspire(config)
    assert served_version(manager, ModelSpec("m")) == 1
    add_versions(tmp_path, "m", 3)
    manager.aspire(config)
    wait_state(manager, "m", 3, ManagerState.AVAILABLE)
    wait_state(manager, "m", 1, ManagerState.END)
    assert served_version(manager, ModelSpec("m")) == 3


def test_removing_every_version_unloads_the_model(
    tmp_path: Path, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1)
    config = model_config(tmp_path, "m")
    manager = make_manager()
    manager.reload_config(config)
    shutil.rmtree(tmp_path / "m" / "1")
    manager.aspire(config)
    wait_state(manager, "m", 1, ManagerState.END)
    with pytest.raises(ServingError, match=r"^Servable not found for request: Latest\(m\)$"):
        served_version(manager, ModelSpec("m"))


def test_failed_loads_are_retried(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "ok", 1)
    add_versions(tmp_path, "flaky", 1)
    add_versions(tmp_path, "broken", 1)
    loader.failures[str(tmp_path / "flaky" / "1")] = 2
    loader.failures[str(tmp_path / "broken" / "1")] = -1
    manager = make_manager(max_num_load_retries=2)
    manager.aspire(model_config(tmp_path, "ok", "flaky", "broken"))
    manager.load_aspired()
    assert loader.attempts[str(tmp_path / "flaky" / "1")] == 3
    assert state_of(manager, "flaky", 1) is ManagerState.AVAILABLE
    assert loader.attempts[str(tmp_path / "broken" / "1")] == 3  # 1 + max_num_load_retries
    broken = manager.version_states("broken")[1]
    assert broken.state is ManagerState.END and broken.health is not None
    assert broken.health.message == f"cannot load {tmp_path / 'broken' / '1'} (attempt 3)"
    assert served_version(manager, ModelSpec("ok")) == 1


def test_retries_stop_once_the_version_is_no_longer_aspired(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1)
    config = model_config(tmp_path, "m")
    loader.failures[str(tmp_path / "m" / "1")] = -1
    # A minute between retries: only the cancellation can end this load within the test.
    manager = make_manager(max_num_load_retries=5, load_retry_interval_s=60.0)
    manager.aspire(config)
    manager.start()
    wait_until(lambda: loader.attempts.get(str(tmp_path / "m" / "1")) == 1, WAIT_S, "first attempt")
    shutil.rmtree(tmp_path / "m" / "1")
    manager.aspire(config)
    wait_state(manager, "m", 1, ManagerState.END)
    assert loader.attempts[str(tmp_path / "m" / "1")] == 1


def test_reload_config_adds_and_removes_models(
    tmp_path: Path, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "a", 1)
    add_versions(tmp_path, "b", 3)
    manager = make_manager()
    manager.reload_config(model_config(tmp_path, "a"))
    with pytest.raises(ServingError, match=r"Latest\(b\)"):
        served_version(manager, ModelSpec("b"))
    manager.reload_config(model_config(tmp_path, "a", "b"))  # returns once b is AVAILABLE
    assert served_version(manager, ModelSpec("b")) == 3
    manager.reload_config(model_config(tmp_path, "b"))
    wait_state(manager, "a", 1, ManagerState.END)
    with pytest.raises(ServingError, match=r"Latest\(a\)"):
        served_version(manager, ModelSpec("a"))
    assert manager.available_versions() == {"b": [3]}
    manager.reload_config(parse_config("model_config_list {}"))  # an empty list removes all
    wait_state(manager, "b", 3, ManagerState.END)


def test_reload_config_applies_version_policy_changes(
    tmp_path: Path, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1, 2)
    manager = make_manager()
    manager.reload_config(model_config(tmp_path, "m", extra="model_version_policy { all {} }"))
    # ReloadConfig returns once the latest version is AVAILABLE (TF Serving waits for
    # ServableRequest::Latest); the older one may still be loading.
    wait_state(manager, "m", 1, ManagerState.AVAILABLE)
    assert manager.available_versions() == {"m": [2, 1]}
    manager.reload_config(model_config(tmp_path, "m"))  # latest 1
    wait_state(manager, "m", 1, ManagerState.END)
    assert manager.available_versions() == {"m": [2]}
    specific = "model_version_policy { specific { versions: 1 } }"
    manager.reload_config(model_config(tmp_path, "m", extra=specific))
    wait_state(manager, "m", 1, ManagerState.AVAILABLE)  # loaded again
    wait_state(manager, "m", 2, ManagerState.END)  # after v1 is AVAILABLE
    assert manager.available_versions() == {"m": [1]}


def test_reload_config_moves_labels_only_to_available_versions(
    tmp_path: Path, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "m", 1, 2)
    add_versions(tmp_path, "new", 1)
    specific_1 = "model_version_policy { specific { versions: 1 } }"
    manager = make_manager()
    manager.reload_config(model_config(tmp_path, "m", extra=specific_1))
    manager.reload_config(
        model_config(tmp_path, "m", extra=specific_1 + ' version_labels { key: "stable" value: 1 }')
    )
    assert served_version(manager, ModelSpec("m", version_label="stable")) == 1
    # Loading v2 and pointing the label at it in one change is refused, and nothing changes:
    # neither the label, nor the versions, nor the model added alongside.
    both = "model_version_policy { specific { versions: 1 versions: 2 } }"
    config = model_config(tmp_path, "m", extra=both + ' version_labels { key: "stable" value: 2 }')
    config.model_config_list.config.extend(model_config(tmp_path, "new").model_config_list.config)
    with pytest.raises(ServingError) as info:
        manager.reload_config(config)
    assert (info.value.code, info.value.message) == (
        Code.FAILED_PRECONDITION,
        "Request to assign label to version 2 of model m, which is not currently available for "
        "inference",
    )
    assert manager.version_states("new") == {} and 2 not in manager.version_states("m")
    assert served_version(manager, ModelSpec("m", version_label="stable")) == 1
    # The TF Serving way: load v2 first, then move the label.
    manager.reload_config(
        model_config(tmp_path, "m", extra=both + ' version_labels { key: "stable" value: 1 }')
    )
    wait_state(manager, "m", 2, ManagerState.AVAILABLE)
    manager.reload_config(
        model_config(tmp_path, "m", extra=both + ' version_labels { key: "stable" value: 2 }')
    )
    assert served_version(manager, ModelSpec("m", version_label="stable")) == 2
    manager.reload_config(model_config(tmp_path, "m", extra=both))
    with pytest.raises(ServingError, match="^Unrecognized servable version label: stable$"):
        served_version(manager, ModelSpec("m", version_label="stable"))


def test_reload_config_reports_models_that_did_not_become_available(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "a", 1)
    add_versions(tmp_path, "broken", 4)
    (tmp_path / "empty").mkdir()  # a base path without versions is not waited for
    loader.failures[str(tmp_path / "broken" / "4")] = -1
    manager = make_manager()
    manager.reload_config(model_config(tmp_path, "a"))
    with pytest.raises(ServingError) as info:
        manager.reload_config(model_config(tmp_path, "a", "broken", "empty"))
    assert info.value.code is Code.UNKNOWN
    assert info.value.message == (
        "1 model(s) did not become available: {{{name: broken version: 4} due to error: "
        f"NOT_FOUND: cannot load {tmp_path / 'broken' / '4'} (attempt 1)}}, }}"
    )
    assert served_version(manager, ModelSpec("a")) == 1  # the others keep serving


@pytest.mark.parametrize(
    ("first", "second", "code", "message"),
    [
        (
            'model_config_list { config { name: "a" base_path: "{root}/a" '
            'model_platform: "tensorflow" } }',
            "",
            Code.FAILED_PRECONDITION,
            "Cannot transition to requested config. It is only legal to transition from one "
            "ModelConfigList to another.",
        ),
        (
            'model_config_list { config { name: "a" base_path: "{root}/a" '
            'model_platform: "tensorflow" } }',
            "custom_model_config {}",
            Code.FAILED_PRECONDITION,
            "Cannot transition to requested config. It is only legal to transition from one "
            "ModelConfigList to another.",
        ),
        (
            "",
            'model_config_list { config { name: "a" base_path: "{root}/a" '
            'model_platform: "tensorflow" } config { name: "a" base_path: "{root}/a" '
            'model_platform: "tensorflow" } }',
            Code.INVALID_ARGUMENT,
            "Illegal to list model a multiple times in config list",
        ),
    ],
)
def test_reload_config_transitions(
    tmp_path: Path,
    make_manager: Callable[..., ServableManager],
    first: str,
    second: str,
    code: Code,
    message: str,
) -> None:
    add_versions(tmp_path, "a", 1)
    manager = make_manager()
    manager.reload_config(parse_config(first.replace("{root}", str(tmp_path))))
    with pytest.raises(ServingError) as info:
        manager.reload_config(parse_config(second.replace("{root}", str(tmp_path))))
    assert (info.value.code, info.value.message) == (code, message)


def test_empty_first_config_takes_no_action(
    tmp_path: Path, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "a", 1)
    manager = make_manager()
    manager.reload_config(ModelServerConfig())
    manager.reload_config(model_config(tmp_path, "a"))  # still the "first" config
    assert served_version(manager, ModelSpec("a")) == 1


def test_stopping_releases_a_waiting_reload(
    tmp_path: Path, loader: FakeLoader, make_manager: Callable[..., ServableManager]
) -> None:
    add_versions(tmp_path, "slow", 1)
    gate = loader.gate(tmp_path / "slow" / "1")
    manager = make_manager()
    outcome: list[BaseException | None] = []

    def reload() -> None:
        try:
            manager.reload_config(model_config(tmp_path, "slow"))
            outcome.append(None)
        except ServingError as exc:
            outcome.append(exc)

    thread = threading.Thread(target=reload)
    thread.start()
    wait_state(manager, "slow", 1, ManagerState.LOADING)
    manager.stop_loading()
    thread.join(WAIT_S)
    gate.set()
    assert len(outcome) == 1 and isinstance(outcome[0], ServingError)
    assert outcome[0].code is Code.UNAVAILABLE


def test_config_file_poll_reloads_or_logs(
    tmp_path: Path, make_manager: Callable[..., ServableManager], caplog: pytest.LogCaptureFixture
) -> None:
    add_versions(tmp_path, "a", 1)
    add_versions(tmp_path, "b", 1)
    config_file = tmp_path / "models.config"
    config_file.write_text(text_format.MessageToString(model_config(tmp_path, "a")))
    manager = make_manager()
    assert poll_filesystem_and_reload_config(str(config_file), manager)
    config_file.write_text(text_format.MessageToString(model_config(tmp_path, "a", "b")))
    assert poll_filesystem_and_reload_config(str(config_file), manager)
    assert served_version(manager, ModelSpec("b")) == 1
    with caplog.at_level(logging.ERROR, logger="serving.model_servers.config_reloader"):
        config_file.write_text("model_config_list { bogus: 1 }")
        assert not poll_filesystem_and_reload_config(str(config_file), manager)
        config_file.write_text(
            'model_config_list { config { name: "a" base_path: "relative" '
            'model_platform: "tensorflow" } }'
        )
        assert not poll_filesystem_and_reload_config(str(config_file), manager)
    messages = [record.getMessage() for record in caplog.records]
    assert messages[0].startswith(
        f"Failed to read ModelServerConfig file: Invalid protobuf file: '{config_file}'"
    )
    assert messages[1] == (
        "PollFilesystemAndReloadConfig failed to ReloadConfig: Expected model a to have an "
        "absolute path or URI; got base_path()=relative"
    )
    assert manager.available_versions() == {"a": [1], "b": [1]}  # the running config stays
