"""docker-compose.yml and the API's Dockerfile, checked structurally (no Docker engine here)."""

from __future__ import annotations

import yaml

from tests.support import REPO


def load() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_and_images() -> None:
    services = load()["services"]
    assert set(services) == {"serving", "api"}
    assert services["serving"]["image"].split(":")[0].endswith("tensorflow/serving")
    assert services["api"]["build"]["dockerfile"] == "Dockerfile"


def test_serving_mounts_models_and_config_and_uses_them() -> None:
    serving = load()["services"]["serving"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in serving["volumes"]}
    assert mounts["./models"] == "/models"
    config_in_container = mounts["./models.config"]
    assert f"--model_config_file={config_in_container}" in serving["command"]
    # every base_path in models.config lives under the /models mount
    for line in (REPO / "models.config").read_text().splitlines():
        if line.strip().startswith("base_path:"):
            assert line.split('"')[1].startswith("/models/")


def test_serving_ports_stay_internal() -> None:
    doc = load()
    serving = doc["services"]["serving"]
    assert "ports" not in serving, "serving must not publish ports to the host"
    assert {"8500", "8501"} <= {str(p) for p in serving["expose"]}
    assert serving["networks"] == ["backend"]
    assert doc["networks"]["backend"]["internal"] is True


def test_api_reaches_serving_by_service_name_and_waits_for_health() -> None:
    api = load()["services"]["api"]
    assert api["environment"]["SERVING_URL"] == "http://serving:8501"
    assert api["depends_on"]["serving"]["condition"] == "service_healthy"
    assert "8000:8000" in api["ports"]
    assert "backend" in api["networks"] and "frontend" in api["networks"]


def test_healthchecks() -> None:
    services = load()["services"]
    for name in ("serving", "api"):
        check = services[name]["healthcheck"]
        assert check["test"][0] == "CMD"
        assert check["interval"] and check["retries"] >= 1
    assert "AVAILABLE" in services["serving"]["healthcheck"]["test"][-1]
    assert "/readyz" in services["api"]["healthcheck"]["test"][-1]


def test_api_image_installs_only_the_api_extra_and_runs_as_non_root() -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    installs = [line for line in lines if line.startswith("RUN pip install")]
    assert installs == ["RUN pip install '.[api]'"]
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    assert not any("tensorflow" in line for line in lines)
