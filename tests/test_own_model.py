"""Serve your own model, as docs/own-model.md says: a SavedModel of one's own and a route declared
outside `api/`, served through both tiers (run-server.sh) over REST and gRPC, and scored.

The model is exported here (examples/own_model/export.py: a logistic regression on the
iris data that ships inside scikit-learn), the route is examples/own_model/iris_route.py,
and serving's config names that model alone: `make run`'s path with nothing but the
user's model.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.support import REPO, free_port, run_server_env, start_run_server, wait_run_server

OWN = REPO / "examples" / "own_model"


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The models config of the exported iris model (its only model)."""
    tmp = tmp_path_factory.mktemp("own-model")
    out = subprocess.run(
        [sys.executable, str(OWN / "export.py"), str(tmp / "iris")], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp / "iris" / "1" / "saved_model.pb").is_file()
    config = tmp / "models.config"
    model = f'name: "iris" base_path: "{tmp}/iris" model_platform: "tensorflow"'
    config.write_text(f"model_config_list {{ config {{ {model} }} }}\n")
    return config


@pytest.fixture(scope="module")
def reference() -> object:
    """scikit-learn's own probabilities for the flowers, from the very classifier exported."""
    sys.path.insert(0, str(OWN))
    try:
        from export import fit  # examples/own_model/export.py
    finally:
        sys.path.remove(str(OWN))
    return fit()


def test_the_route_uses_the_extension_point_only() -> None:
    tree = ast.parse((OWN / "iris_route.py").read_text())
    modules = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)} | {
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    }
    assert {m for m in modules if m and m.split(".")[0] == "api"} == {"api.model_routes"}


@pytest.fixture(params=["rest", "grpc"])
def api(request: pytest.FixtureRequest, exported: Path, tmp_path: Path) -> Iterator[str]:
    """run-server.sh on the user's config and route; yields the API's base URL."""
    port = free_port()
    env = {
        "MODEL_CONFIG_FILE": str(exported),
        "MODEL_ROUTES": "iris_route:route",
        "PYTHONPATH": str(OWN),
        "SERVING_PROTOCOL": request.param,
        "PYTHON": sys.executable,
        "API_PORT": str(port),
        "API_HOST": "127.0.0.1",
        "REST_API_PORT": str(free_port()),
        "GRPC_PORT": str(free_port()),
        "WEB_CONCURRENCY": "1",
        "SERVING_ARGS": "--rest_api_host=127.0.0.1",
    }
    proc = start_run_server(tmp_path / "run-server.log", **env)
    try:
        wait_run_server(proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()


def test_an_own_model_is_served_and_scored(api: str, reference: object) -> None:
    ready = httpx.get(api + "/readyz", timeout=10).json()
    assert ready["status"] == "ready" and list(ready["models"]) == ["iris"]
    flowers = [[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3], [5.9, 3.0, 5.1, 1.8]]
    expected = reference.predict_proba(np.asarray(flowers))  # type: ignore[attr-defined]
    names = ("sepal_length", "sepal_width", "petal_length", "petal_width")
    for flower, want in zip(flowers, expected, strict=True):
        r = httpx.post(api + "/v1/iris/classify", json=dict(zip(names, flower, strict=True)), timeout=10)
        assert r.status_code == 200, r.text
        body = r.json()
        got = [body["probabilities"][s] for s in ("setosa", "versicolor", "virginica")]
        assert got == pytest.approx(want, abs=1e-5)  # float32 in the model, float64 in scikit-learn
        assert body["species"] == ("setosa", "versicolor", "virginica")[int(np.argmax(want))]
        assert body["model"] == {"name": "iris", "version": 1}
    refused = httpx.post(api + "/v1/iris/classify", json={"sepal_length": -1}, timeout=10)
    assert refused.status_code == 422
    assert httpx.post(api + "/v1/fraud/score", json={}, timeout=10).status_code == 404  # not enabled
    paths = httpx.get(api + "/openapi.json", timeout=10).json()["paths"]
    assert "/v1/iris/classify" in paths and "/v1/fraud/score" not in paths


def test_a_scaffolded_route_serves_a_fresh_export_with_no_line_written(
    exported: Path, reference: object, tmp_path: Path
) -> None:
    """The "serve your own model" page's first steps: scaffold the route from the SavedModel, then
    `make run`'s script on the files it wrote; the model's inputs are its raw features."""
    project = tmp_path / "my-model"
    shutil.copytree(exported.parent / "iris", project / "models" / "iris")
    done = subprocess.run(
        [sys.executable, "-m", "api.model_routes.scaffold", "--saved-model", str(project / "models" / "iris"),
         "--name", "iris"],
        capture_output=True, text=True, cwd=REPO, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    port = free_port()
    env = run_server_env(
        MODELS_DIR=str(project / "models"), MODEL_CONFIG_FILE=str(project / "models.config"),
        PYTHONPATH=str(project / "routes"), MODEL_ROUTES="iris_route:route", API_PORT=str(port), WEB_CONCURRENCY="1",
    )  # fmt: skip
    proc = start_run_server(tmp_path / "run-server.log", **env)
    flowers = [[5.1, 3.5, 1.4, 0.2], [6.2, 2.9, 4.3, 1.3], [7.7, 3.0, 6.1, 2.3]]
    expected = reference.predict_proba(np.asarray(flowers))  # type: ignore[attr-defined]
    try:
        wait_run_server(proc)
        for flower, want in zip(flowers, expected, strict=True):
            r = httpx.post(f"http://127.0.0.1:{port}/v1/iris/predict", json={"measurements": flower}, timeout=10)
            assert r.status_code == 200, r.text
            assert r.json()["probabilities"] == pytest.approx(want, abs=1e-5)
            assert r.json()["model"] == {"name": "iris", "version": 1}
        for bad in ({"measurements": [5.1, 3.5, 1.4]}, {"measurements": ["5.1", 3.5, 1.4, 0.2]}, {}):
            assert httpx.post(f"http://127.0.0.1:{port}/v1/iris/predict", json=bad, timeout=10).status_code == 422
    finally:
        assert proc.stop(timeout_s=60) == 0, proc.log()
