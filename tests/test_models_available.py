"""deploy/serving/models-available.sh, serving's health check in compose and Kubernetes, against a
real model server: the names come from the config it is given, never from a list of its own."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import REPO, Serving, free_port, start_example_serving

SCRIPT = REPO / "deploy" / "serving" / "models-available.sh"


@pytest.fixture(scope="module")
def serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    tmp = tmp_path_factory.mktemp("models-available")
    server = start_example_serving(tmp, rest_api_host="127.0.0.1")
    try:
        server.wait_available("fraud", "digits")
        yield server
    finally:
        server.stop()


def check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=30)


def port_of(serving: Serving) -> str:
    return serving.rest_url.rsplit(":", 1)[1]


def test_ready_when_every_model_the_config_names_is_available(serving: Serving, tmp_path: Path) -> None:
    assert check(str(REPO / "models.config"), port_of(serving)).returncode == 0
    # Another config, in the forms the text format allows: its names, not the examples'.
    own = tmp_path / "models.config"
    own.write_text("# name: \"commented\"\nmodel_config_list { config { name:'fraud' base_path: \"/m\" } }\n")
    assert check(str(own), port_of(serving)).returncode == 0
    own.write_text('model_config_list { config { name: "fraud" } config { name: "iris" } }\n')
    missing = check(str(own), port_of(serving))
    assert missing.returncode == 1 and "model 'iris' has no version AVAILABLE" in missing.stderr


def test_alive_while_the_port_answers_and_not_when_nothing_listens(serving: Serving, tmp_path: Path) -> None:
    own = tmp_path / "models.config"
    own.write_text('model_config_list { config { name: "iris" } }\n')
    assert check("--answers", str(own), port_of(serving)).returncode == 0  # a 404 is an answer
    closed = check("--answers", str(own), str(free_port()))
    assert closed.returncode == 1 and "nothing answers" in closed.stderr
    empty = tmp_path / "empty.config"
    empty.write_text("")
    assert check(str(empty), port_of(serving)).returncode == 1
