"""Hot reload against a real ``python -m serving`` subprocess.

* Version swap under load: with ``--file_system_poll_wait_seconds=1``, eight clients predict in a
  bounded loop while version 2 is copied in (under a temporary name, then renamed into place --
  TF Serving picks up a half-copied directory otherwise) and version 1 is removed. No request may
  fail, and every client's answers switch from version 1's to version 2's exactly once.
* Config file reload: with ``--model_config_file_poll_wait_seconds=1``, rewriting the config adds
  a model, moves a version label (only to a version already AVAILABLE, as TF Serving requires),
  keeps the running config when the new one is refused, and removes a model.

Versions: ``multi/1`` answers ``0.5 * x + 2`` and ``multi/2`` ``0.5 * x + 3`` (serving_testlib).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from tests.serving.serving_testlib import models_config, start_test_serving, write_atomically
from tests.support import Serving, wait_until

DEADLINE_S = 90.0
CLIENTS = 8
MAX_REQUESTS_PER_CLIENT = 3000
LOAD_DEADLINE_S = 60.0
V1_ANSWER, V2_ANSWER = 3.0, 4.0  # for x = 2


@pytest.fixture(scope="module")
def models(serving_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hot_reload_models")
    shutil.copytree(serving_model_dir / "multi" / "1", root / "swap" / "1")
    shutil.copytree(serving_model_dir / "multi", root / "labelled")
    return root


@pytest.fixture(scope="module")
def config_file(models: Path) -> Path:
    path = models / "models.config"
    write_atomically(path, models_config([("swap", models / "swap", "")]))
    return path


@pytest.fixture(scope="module")
def server(config_file: Path, models: Path) -> Iterator[Serving]:
    process = start_test_serving(
        config_file,
        models / "server.log",
        file_system_poll_wait_seconds=1,
        model_config_file_poll_wait_seconds=1,
        max_num_load_retries=0,
        rest_api_num_threads=4,
    )
    try:
        process.wait_for_states("swap", {1: "AVAILABLE"})
        yield process
    finally:
        assert process.stop() == 0, process.log()


@dataclass
class Client:
    """One load-generating client: answers in completion order, and failures."""

    answers: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def run_client(base_url: str, client: Client, stop: threading.Event) -> None:
    deadline = time.monotonic() + LOAD_DEADLINE_S
    with httpx.Client(base_url=base_url, timeout=10.0) as http:
        for _ in range(MAX_REQUESTS_PER_CLIENT):
            if stop.is_set() or time.monotonic() > deadline:
                return
            try:
                response = http.post("/v1/models/swap:predict", json={"instances": [2.0]})
            except httpx.HTTPError as exc:
                client.failures.append(repr(exc))
                continue
            if response.status_code != 200:
                client.failures.append(f"{response.status_code} {response.text}")
                continue
            client.answers.append(response.json()["predictions"][0])


def test_version_swap_under_load_fails_no_request(
    server: Serving, models: Path, serving_model_dir: Path
) -> None:
    stop = threading.Event()
    clients = [Client() for _ in range(CLIENTS)]
    threads = [
        threading.Thread(target=run_client, args=(server.rest_url, client, stop))
        for client in clients
    ]
    for thread in threads:
        thread.start()
    try:
        wait_until(lambda: all(len(c.answers) >= 20 for c in clients), DEADLINE_S, "load on version 1")
        # The new version appears atomically; the old one goes right after.
        incoming = models / "swap" / ".2.incoming"
        shutil.copytree(serving_model_dir / "multi" / "2", incoming)
        os.rename(incoming, models / "swap" / "2")
        shutil.rmtree(models / "swap" / "1")
        server.wait_for_states("swap", {2: "AVAILABLE", 1: "END"}, 30.0)
        counts = [len(c.answers) for c in clients]
        wait_until(
            lambda: all(len(c.answers) >= n + 20 for c, n in zip(clients, counts, strict=True)),
            DEADLINE_S,
            "load on version 2",
        )
    finally:
        stop.set()
        for thread in threads:
            thread.join(LOAD_DEADLINE_S)

    assert [c.failures for c in clients] == [[]] * CLIENTS
    for client in clients:
        assert set(client.answers) <= {V1_ANSWER, V2_ANSWER}
        switch = client.answers.index(V2_ANSWER)
        assert switch > 0, "each client started on version 1"
        assert client.answers[switch:] == [V2_ANSWER] * (len(client.answers) - switch), (
            "answers switch to version 2 once and for all"
        )
    assert server.states("swap") == {2: "AVAILABLE", 1: "END"}
    assert "Successfully loaded servable version {name: swap version: 2}" in server.log()
    assert "Done unloading servable version {name: swap version: 1}" in server.log()


def predict(server: Serving, path: str) -> httpx.Response:
    return httpx.post(f"{server.rest_url}/v1/models/{path}:predict", json={"instances": [2.0]}, timeout=10.0)


def answers(server: Serving, path: str, expected: float) -> bool:
    response = predict(server, path)
    return response.status_code == 200 and response.json()["predictions"] == [expected]


def test_config_file_reload_adds_models_and_moves_labels(
    server: Serving, config_file: Path, models: Path
) -> None:
    swap = ("swap", models / "swap", "")
    every_version = "model_version_policy { all {} }"

    def labelled(extra: str = "") -> tuple[str, Path, str]:
        return ("labelled", models / "labelled", f"{every_version} {extra}")

    response = predict(server, "labelled")
    assert response.status_code == 404
    write_atomically(config_file, models_config([swap, labelled()]))
    server.wait_for_states("labelled", {1: "AVAILABLE", 2: "AVAILABLE"}, 30.0)

    # Labels go on versions that are already AVAILABLE, in a later config change.
    stable = 'version_labels { key: "stable" value: %d }'
    write_atomically(config_file, models_config([swap, labelled(stable % 1)]))
    wait_until(lambda: answers(server, "labelled/labels/stable", V1_ANSWER), 30.0, "stable -> 1")
    write_atomically(config_file, models_config([swap, labelled(stable % 2)]))
    wait_until(lambda: answers(server, "labelled/labels/stable", V2_ANSWER), 30.0, "stable -> 2")

    # A label on a version that is not loaded is refused; the running config stays.
    write_atomically(config_file, models_config([swap, labelled(stable % 9)]))
    refused = (
        "PollFilesystemAndReloadConfig failed to ReloadConfig: Request to assign label to "
        "version 9 of model labelled, which is not currently available for inference"
    )
    wait_until(lambda: refused in server.log(), 30.0, "the refusal in the log")
    assert answers(server, "labelled/labels/stable", V2_ANSWER)

    # A config that does not parse is logged; the running config stays too.
    write_atomically(config_file, "model_config_list { config { name: ")
    wait_until(
        lambda: "Failed to read ModelServerConfig file: Invalid protobuf file" in server.log(),
        30.0,
        "the parse error in the log",
    )
    assert answers(server, "labelled/versions/1", V1_ANSWER)

    # Removing the model from the config unloads it.
    write_atomically(config_file, models_config([swap]))
    server.wait_for_states("labelled", {1: "END", 2: "END"}, 30.0)
    response = predict(server, "labelled")
    assert response.status_code == 404
    assert response.json() == {"error": "Servable not found for request: Latest(labelled)"}
