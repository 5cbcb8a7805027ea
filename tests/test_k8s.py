"""deploy/k8s: rendered with `kubectl kustomize`, every object validated against Kubernetes' schema,
and the wiring checked against the apps themselves (labels, probes, ports, env, CPU sizing)."""

from __future__ import annotations

import base64
import math
import re
import shutil
import subprocess
import tomllib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any
from urllib.parse import urlsplit

import kubernetes_validate
import pytest
import yaml

from api.app import create_app
from api.config.security import AuthSettings, RateLimitSettings
from api.config.settings import Settings
from api.ops.cpu_budget import threads_per_worker, web_concurrency
from api.security.front_door import FrontDoor, Refusal
from tests.support import REPO

K8S = REPO / "deploy" / "k8s"
# The newest schema kubernetes-validate ships (1.37 with kubernetes-validate 1.37).
K8S_VERSION = kubernetes_validate.latest_version()

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="needs kubectl (kustomize) on PATH")


@pytest.fixture(scope="module")
def objects() -> list[dict[str, Any]]:
    rendered = subprocess.run(
        ["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return [doc for doc in yaml.safe_load_all(rendered) if doc]


def of_kind(objects: list[dict[str, Any]], kind: str) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def containers(objects: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for name, deployment in of_kind(objects, "Deployment").items():
        for container in deployment["spec"]["template"]["spec"]["containers"]:
            yield name, container


def matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def cpus(quantity: str) -> float:
    return int(quantity[:-1]) / 1000 if quantity.endswith("m") else float(quantity)


def test_every_object_validates_strictly_against_the_current_schema(objects: list[dict[str, Any]]) -> None:
    kinds = sorted(o["kind"] for o in objects)
    for kind in ("ConfigMap", "Deployment", "HorizontalPodAutoscaler", "NetworkPolicy", "PodDisruptionBudget"):
        assert kind in kinds
    for obj in objects:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)  # raises ValidationError


def test_strict_validation_rejects_an_unknown_field(objects: list[dict[str, Any]]) -> None:
    # The validator is not vacuous: a misspelt field fails.
    deployment = dict(of_kind(objects, "Deployment")["api"])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSION, strict=True)


def test_selectors_match_labels(objects: list[dict[str, Any]]) -> None:
    deployments = of_kind(objects, "Deployment")
    assert set(deployments) == {"api", "serving"}
    pod_labels = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in deployments.items()}
    for name, deployment in deployments.items():
        assert matches(deployment["spec"]["selector"]["matchLabels"], pod_labels[name])
    for name, service in of_kind(objects, "Service").items():
        assert [n for n, labels in pod_labels.items() if matches(service["spec"]["selector"], labels)] == [name]
    for name, pdb in of_kind(objects, "PodDisruptionBudget").items():
        assert matches(pdb["spec"]["selector"]["matchLabels"], pod_labels[name])
    for name, hpa in of_kind(objects, "HorizontalPodAutoscaler").items():
        target = hpa["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", name)
        assert hpa["spec"]["minReplicas"] >= 2  # a PDB of maxUnavailable 1 keeps one serving


def test_services_target_named_container_ports(objects: list[dict[str, Any]]) -> None:
    ports = {name: {p["name"]: p["containerPort"] for p in c["ports"]} for name, c in containers(objects)}
    for name, service in of_kind(objects, "Service").items():
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in ports[name], (name, port)
    assert ports["serving"] == {"grpc": 8500, "http": 8501}  # TF Serving's ports
    assert ports["api"]["http"] == 8000


def test_only_api_pods_reach_servings_ports(objects: list[dict[str, Any]]) -> None:
    (policy,) = of_kind(objects, "NetworkPolicy").values()
    pods = {n: d["spec"]["template"]["metadata"]["labels"] for n, d in of_kind(objects, "Deployment").items()}
    assert matches(policy["spec"]["podSelector"]["matchLabels"], pods["serving"])
    assert not matches(policy["spec"]["podSelector"]["matchLabels"], pods["api"])
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    (rule,) = policy["spec"]["ingress"]
    (source,) = rule["from"]
    assert set(source) == {"podSelector"}  # pods of this namespace, no ipBlock or namespaceSelector
    assert matches(source["podSelector"]["matchLabels"], pods["api"])
    assert {p["port"] for p in rule["ports"]} == {8500, 8501}


def test_api_reaches_serving_through_the_headless_service(objects: list[dict[str, Any]]) -> None:
    env = {e["name"]: e["value"] for _, c in containers(objects) if c["name"] == "api" for e in c["env"]}
    url = urlsplit(env["SERVING_URL"])
    service = of_kind(objects, "Service")[url.hostname]
    assert service["spec"]["clusterIP"] == "None"  # DNS answers every ready pod's address
    assert url.port in {p["port"] for p in service["spec"]["ports"]}
    assert float(env["SERVING_RESOLVE_INTERVAL_S"]) > 0


def test_api_env_names_are_settings_or_gunicorn_variables(objects: list[dict[str, Any]]) -> None:
    settings = {name.upper() for name in Settings.model_fields}
    gunicorn_conf = (REPO / "gunicorn.conf.py").read_text()
    gunicorn_vars = set(re.findall(r"""os\.environ\.get\(\s*["']([A-Z_]+)["']""", gunicorn_conf))
    assert {"API_BIND", "API_GRACEFUL_TIMEOUT_S"} <= gunicorn_vars
    (api,) = [c for name, c in containers(objects) if name == "api"]
    names = [e["name"] for e in api["env"]]
    # A nested setting (AUTH__ENABLED) is named by its field, then `__` and the nested field's name;
    # OTEL_*: OpenTelemetry's own variables (otel_tracing and the SDK read them).
    unknown = [
        n for n in names if n not in gunicorn_vars and n.split("__")[0] not in settings and not n.startswith("OTEL_")
    ]
    assert not unknown, f"env the API never reads: {unknown}"
    env = {e["name"]: e["value"] for e in api["env"]}
    with pytest.MonkeyPatch.context() as patch:  # values parse too, read as the app reads them
        for name, value in env.items():
            if name not in gunicorn_vars:
                patch.setenv(name, value)
        Settings()
    assert env["API_BIND"].rsplit(":", 1)[1] == "8000"


def test_api_probes_are_routes_of_the_app(objects: list[dict[str, Any]]) -> None:
    (api,) = [c for name, c in containers(objects) if name == "api"]
    env = {e["name"]: e["value"] for e in api["env"]}
    # The routes the app declares, with the model routes the Deployment enables.
    routes = set(create_app(Settings(model_routes=env["MODEL_ROUTES"].split(","))).openapi()["paths"])
    assert api["readinessProbe"]["httpGet"]["path"] == "/readyz" in routes
    assert api["livenessProbe"]["httpGet"]["path"] == "/healthz" in routes
    for probe in ("readinessProbe", "livenessProbe"):
        assert api[probe]["httpGet"]["port"] == "http"


def test_serving_probes_read_the_model_names_from_the_mounted_config(objects: list[dict[str, Any]]) -> None:
    # No model names in the manifests: the probes' script reads them from /config/models.config.
    (serving,) = [c for name, c in containers(objects) if name == "serving"]
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = serving[probe]["exec"]["command"]
        assert command[:2] == ["bash", "/config/models-available.sh"], command
        assert command[-2:] == ["/config/models.config", "8501"]
        assert "fraud" not in " ".join(command) and "digits" not in " ".join(command)
    assert "--answers" in serving["livenessProbe"]["exec"]["command"]  # alive: the port answers HTTP
    config_maps = {name.rsplit("-", 1)[0]: cm for name, cm in of_kind(objects, "ConfigMap").items()}
    assert config_maps["serving-monitoring"]["data"]["models-available.sh"] == (
        REPO / "deploy" / "serving" / "models-available.sh"
    ).read_text()


def test_cpu_limits_agree_with_how_each_tier_sizes_its_threads(objects: list[dict[str, Any]]) -> None:
    by_name = dict(containers(objects))
    for name, container in by_name.items():
        resources = container["resources"]
        # requests = limits: the quota the processes size themselves from is what is reserved.
        assert resources["requests"]["cpu"] == resources["limits"]["cpu"], name
    api, serving = by_name["api"], by_name["serving"]
    api_cpus = math.ceil(cpus(api["resources"]["limits"]["cpu"]))
    env = {e["name"]: e["value"] for e in api["env"]}
    assert "WEB_CONCURRENCY" not in env  # workers follow the quota (gunicorn.conf.py)
    workers = web_concurrency(env, api_cpus)
    assert workers == api_cpus and threads_per_worker(api_cpus, workers) == 1
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in serving["args"])
    serving_cpus = math.ceil(cpus(serving["resources"]["limits"]["cpu"]))
    intra, inter = int(flags["tensorflow_intra_op_parallelism"]), int(flags["tensorflow_inter_op_parallelism"])
    assert intra == serving_cpus and 1 <= inter <= serving_cpus
    assert int(flags["rest_api_num_threads"]) == 4 * serving_cpus  # TF Serving's default per CPU


def test_non_root_and_read_only_root_filesystem(objects: list[dict[str, Any]]) -> None:
    for name, deployment in of_kind(objects, "Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["allowPrivilegeEscalation"] is False and context["capabilities"]["drop"] == ["ALL"]
            mounts = {m["mountPath"] for m in container["volumeMounts"]}
            assert "/tmp" in mounts, f"{name}: a writable /tmp (gunicorn's metrics dir, TensorFlow's temp files)"


def test_serving_gets_models_config_and_models_volume(objects: list[dict[str, Any]]) -> None:
    deployment = of_kind(objects, "Deployment")["serving"]
    pod = deployment["spec"]["template"]["spec"]
    (serving,) = pod["containers"]
    mounts = {m["name"]: m for m in serving["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert mounts["models"]["mountPath"] == "/models" and mounts["models"]["readOnly"] is True
    assert volumes["models"]["persistentVolumeClaim"]["claimName"] in of_kind(objects, "PersistentVolumeClaim")
    assert mounts["config"]["mountPath"] == "/config"
    config_maps = of_kind(objects, "ConfigMap")
    data: dict[str, str] = {}
    for source in volumes["config"]["projected"]["sources"]:
        data |= config_maps[source["configMap"]["name"]]["data"]
    assert set(data) == {"models.config", "monitoring.config", "models-available.sh"}
    assert "--model_config_file=/config/models.config" in serving["args"]
    assert "--monitoring_config_file=/config/monitoring.config" in serving["args"]
    for line in data["models.config"].splitlines():
        if line.strip().startswith("base_path:"):
            assert line.split('"')[1].startswith("/models/")


def test_config_copies_equal_the_repository_files() -> None:
    # kustomize reads no file outside deploy/k8s, so these are copies; they must not drift.
    base = K8S / "base"
    assert (base / "models.config").read_text() == (REPO / "models.config").read_text()
    for name in ("monitoring.config", "models-available.sh"):
        assert (base / name).read_text() == (REPO / "deploy" / "serving" / name).read_text()


def test_api_image_is_the_one_compose_builds(objects: list[dict[str, Any]]) -> None:
    # `docker compose build api` tags the image the API Deployment runs, the project's version
    # (a build tagged `latest` against manifests naming `0.1.0` would never start).
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    images = {name: container["image"] for name, container in containers(objects)}
    assert images["api"] == compose["services"]["api"]["image"]
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert images["api"] == f"tfserve-split/api-examples:{version}"


def test_api_requires_a_key_from_the_api_keys_secret_mounted_whole(
    objects: list[dict[str, Any]], tmp_path: Path
) -> None:
    deployment = of_kind(objects, "Deployment")["api"]
    pod = deployment["spec"]["template"]["spec"]
    (api,) = pod["containers"]
    env = {e["name"]: e["value"] for e in api["env"]}
    assert env["AUTH__ENABLED"] == "true"
    key_file = PurePosixPath(env["AUTH__API_KEYS_FILE"])
    (mount,) = [m for m in api["volumeMounts"] if m["mountPath"] == str(key_file.parent)]
    assert mount["readOnly"] is True and "subPath" not in mount  # a subPath mount never sees updates
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    secret = of_kind(objects, "Secret")[volume["secret"]["secretName"]]
    assert secret["metadata"]["name"] == "api-keys"  # no hash suffix: updated in place, not rolled
    assert key_file.name in secret["data"]
    # The Secret's file is one the front door loads (the base lists no key: all but the probes refused).
    (tmp_path / "api-keys").write_bytes(base64.b64decode(secret["data"][key_file.name]))
    auth = AuthSettings(enabled=True, api_keys_file=tmp_path / "api-keys")
    door = FrontDoor(auth, RateLimitSettings())
    assert door.api_keys is not None and not door.api_keys.keys
    for probe in ("readinessProbe", "livenessProbe"):
        assert door.check(api[probe]["httpGet"]["path"], [], None) is None  # the probes are public
    assert isinstance(door.check("/v1/fraud/score", [], None), Refusal)
