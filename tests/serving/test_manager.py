"""Unit tests for serving.core.manager with a fake loader (no TensorFlow), and model status."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import text_format

from serving.apis import ModelSpec
from serving.config.model_server_config import ModelServerConfig
from serving.core.manager import ServableManager
from serving.core.servable_state import ManagerState, ServableState
from serving.model_servers.get_model_status_impl import get_model_status, model_status_json
from serving.util.errors import Code, ServingError


class FakeServable:
    def __init__(self, path: str) -> None:
        self.path = path
        self.closed = False

    def close(self) -> None:
        self.closed = True


def fake_loader(path: str) -> FakeServable:
    if "broken" in path:
        raise ServingError(Code.NOT_FOUND, f"Could not find SavedModel at {path}")
    return FakeServable(path)


def make_tree(root: Path, layout: dict[str, list[int]]) -> None:
    for name, versions in layout.items():
        for version in versions:
            (root / name / str(version)).mkdir(parents=True)


def make_config(root: Path, extra: str = "") -> ModelServerConfig:
    text = f"""model_config_list {{
      config {{ name: "m" base_path: "{root / "m"}" model_platform: "tensorflow"
               model_version_policy {{ all {{}} }}
               version_labels {{ key: "stable" value: 1 }} {extra} }}
      config {{ name: "broken" base_path: "{root / "broken"}" model_platform: "tensorflow" }}
      config {{ name: "absent" base_path: "{root / "absent"}" model_platform: "tensorflow" }}
    }}"""
    return text_format.Parse(text, ModelServerConfig())


@pytest.fixture
def manager(tmp_path: Path) -> Iterator[ServableManager]:
    make_tree(tmp_path, {"m": [1, 2], "broken": [4]})
    # The config labels version 1 before it is loaded: TF Serving needs this flag for that.
    manager = ServableManager(fake_loader, allow_version_labels_for_unavailable_models=True)
    manager.aspire(make_config(tmp_path))
    yield manager
    manager.unload_all()


def test_aspired_versions_start(manager: ServableManager) -> None:
    assert manager.version_states("m") == {
        2: ServableState(ManagerState.START),
        1: ServableState(ManagerState.START),
    }
    assert manager.version_states("absent") == {}
    assert manager.version_states("unknown") == {}


def test_states_after_load(manager: ServableManager) -> None:
    manager.load_aspired()
    assert [s.state for s in manager.version_states("m").values()] == [ManagerState.AVAILABLE] * 2
    (broken,) = manager.version_states("broken").values()
    assert broken.state is ManagerState.END
    assert broken.health is not None and broken.health.code is Code.NOT_FOUND
    assert manager.available_versions() == {"m": [2, 1], "broken": [], "absent": []}


def test_acquire_latest_specific_and_label(manager: ServableManager) -> None:
    manager.load_aspired()
    with manager.acquire(ModelSpec("m")) as handle:
        assert handle.version == 2 and handle.servable.path.endswith("/m/2")
    with manager.acquire(ModelSpec("m", version=1)) as handle:
        assert handle.version == 1
    with manager.acquire(ModelSpec("m", version_label="stable")) as handle:
        assert handle.version == 1


@pytest.mark.parametrize(
    ("spec", "code", "message"),
    [
        (ModelSpec("nope"), Code.NOT_FOUND, "Servable not found for request: Latest(nope)"),
        (
            ModelSpec("m", version=9),
            Code.NOT_FOUND,
            "Servable not found for request: Specific(m, 9)",
        ),
        (ModelSpec("broken"), Code.NOT_FOUND, "Servable not found for request: Latest(broken)"),
        (
            ModelSpec("m", version_label="x"),
            Code.INVALID_ARGUMENT,
            "Unrecognized servable version label: x",
        ),
        (ModelSpec(""), Code.INVALID_ARGUMENT, "ModelSpec has no name specified."),
    ],
)
def test_acquire_errors(
    manager: ServableManager, spec: ModelSpec, code: Code, message: str
) -> None:
    manager.load_aspired()
    with pytest.raises(ServingError) as info, manager.acquire(spec):
        pass
    assert (info.value.code, info.value.message) == (code, message)


def test_nothing_is_available_before_loading(manager: ServableManager) -> None:
    with (
        pytest.raises(ServingError, match=r"^Servable not found for request: Latest\(m\)$"),
        manager.acquire(ModelSpec("m")),
    ):
        pass
    # The label is installed with the config; its version is not loaded yet.
    with (
        pytest.raises(ServingError) as info,
        manager.acquire(ModelSpec("m", version_label="stable")),
    ):
        pass
    assert info.value.code is Code.NOT_FOUND
    assert info.value.message == "Servable not found for request: Specific(m, 1)"


def test_labels_before_any_config_are_unavailable() -> None:
    with (
        pytest.raises(ServingError) as info,
        ServableManager(fake_loader).acquire(ModelSpec("m", version_label="stable")),
    ):
        pass
    assert info.value.code is Code.UNAVAILABLE
    assert info.value.message == "Model labels does not init yet.stable"


def test_label_on_unavailable_version_is_refused(tmp_path: Path) -> None:
    make_tree(tmp_path, {"m": [1, 2], "broken": [4]})
    manager = ServableManager(fake_loader)
    with pytest.raises(ServingError) as info:
        manager.aspire(make_config(tmp_path, 'version_labels { key: "ghost" value: 7 }'))
    assert info.value.code is Code.FAILED_PRECONDITION
    assert info.value.message == (
        "Request to assign label to version 7 of model m, which is not currently available "
        "for inference"
    )
    allowing = ServableManager(fake_loader, allow_version_labels_for_unavailable_models=True)
    allowing.aspire(make_config(tmp_path, 'version_labels { key: "ghost" value: 7 }'))
    allowing.load_aspired()
    with (
        pytest.raises(ServingError, match=r"Specific\(m, 7\)"),
        allowing.acquire(ModelSpec("m", version_label="ghost")),
    ):
        pass


def test_unload_waits_for_in_flight_requests(manager: ServableManager) -> None:
    manager.load_aspired()
    servables: list[Any] = []
    unloaded = threading.Event()
    with manager.acquire(ModelSpec("m")) as handle:
        servables.append(handle.servable)
        thread = threading.Thread(target=lambda: (manager.unload_all(), unloaded.set()))
        thread.start()
        assert not unloaded.wait(0.2)
        assert manager.version_states("m")[2].state is ManagerState.UNLOADING
        assert not servables[0].closed
    thread.join(5)
    assert unloaded.is_set() and servables[0].closed
    assert {s.state for s in manager.version_states("m").values()} == {ManagerState.END}


def test_model_status_responses(manager: ServableManager) -> None:
    # Imports tensorflow_serving.apis' status proto, which loads TensorFlow.

    manager.load_aspired()
    body = model_status_json(get_model_status(manager, ModelSpec("m")))
    assert body == (
        b'{"model_version_status":['
        b'{"version":"2","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}},'
        b'{"version":"1","state":"AVAILABLE","status":{"error_code":"OK","error_message":""}}]}'
    )
    broken = get_model_status(manager, ModelSpec("broken"))
    assert broken.model_version_status[0].status.error_message.startswith("Could not find")
    for spec, expected in [
        (ModelSpec("m", version=3), "Could not find version 3 of model m"),
        (ModelSpec("absent"), "Could not find any versions of model absent"),
    ]:
        with pytest.raises(ServingError) as info:
            get_model_status(manager, spec)
        assert (info.value.code, info.value.message) == (Code.NOT_FOUND, expected)
