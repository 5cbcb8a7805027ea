"""deploy/k8s/overlays/own-model: the base with one's own model config and route, rendered with
`kubectl kustomize` and every object validated strictly, and its wiring checked against the app.

As shipped the overlay serves the iris example (examples/own_model): its models.config and its
route module, which the API loads from the api-routes ConfigMap."""

from __future__ import annotations

import shutil
import subprocess
import sys
from typing import Any

import kubernetes_validate
import pytest
import yaml

from api.app import create_app
from api.config.serving_config import model_names
from api.config.settings import Settings
from tests.support import REPO
from tests.test_k8s import K8S_VERSION, containers, of_kind

OVERLAY = REPO / "deploy" / "k8s" / "overlays" / "own-model"

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize) on PATH")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def config_map(objects: list[dict[str, Any]], prefix: str) -> dict[str, Any]:
    (found,) = [cm for name, cm in of_kind(objects, "ConfigMap").items() if name.rsplit("-", 1)[0] == prefix]
    return found


def test_every_object_validates_strictly(objects: list[dict[str, Any]]) -> None:
    assert {"Deployment", "ConfigMap", "Service", "PersistentVolumeClaim"} <= {o["kind"] for o in objects}
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_serving_gets_the_overlays_model_config_and_its_probes_follow_it(objects: list[dict[str, Any]]) -> None:
    data = config_map(objects, "serving-config")["data"]
    assert set(data) == {"models.config"}  # behavior: replace, not the examples' config
    assert data["models.config"] == (OVERLAY / "models.config").read_text()
    assert model_names(data["models.config"]) == ["iris"]
    pod = of_kind(objects, "Deployment")["serving"]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == "config")
    names = [source["configMap"]["name"] for source in volume["projected"]["sources"]]
    assert config_map(objects, "serving-config")["metadata"]["name"] in names  # the hashed name, rewritten
    (serving,) = pod["containers"]
    assert serving["readinessProbe"]["exec"]["command"][-2] == "/config/models.config"


def test_the_api_serves_the_overlays_route_from_its_config_map(objects: list[dict[str, Any]]) -> None:
    (api,) = [c for name, c in containers(objects) if name == "api"]
    env = {e["name"]: e["value"] for e in api["env"]}
    assert env["PYTHONPATH"] == "/routes" and env["MODEL_ROUTES"] == "route:route"
    assert api["image"] == "tfserve-split/api:0.1.0"  # the API image alone: no example code
    mounts = {m["mountPath"]: m["name"] for m in api["volumeMounts"]}
    pod = of_kind(objects, "Deployment")["api"]["spec"]["template"]["spec"]
    volume = next(v for v in pod["volumes"] if v["name"] == mounts["/routes"])
    routes = config_map(objects, "api-routes")
    assert volume["configMap"]["name"] == routes["metadata"]["name"]
    assert routes["data"]["route.py"] == (REPO / "examples" / "own_model" / "iris_route.py").read_text()
    # The route loads as the pod would load it, and its model is the one serving's config names.
    sys.path.insert(0, str(OVERLAY))
    try:
        app = create_app(Settings(model_routes=env["MODEL_ROUTES"].split(",")))
    finally:
        sys.path.remove(str(OVERLAY))
        sys.modules.pop("route", None)
    (endpoint,) = app.state.model_endpoints
    assert [endpoint.configured.signature.model_name] == model_names((OVERLAY / "models.config").read_text())
    paths = set(app.openapi()["paths"])
    assert {"/v1/iris/classify", api["readinessProbe"]["httpGet"]["path"]} <= paths
