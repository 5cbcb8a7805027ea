"""docker-compose.yml and the Dockerfiles, checked structurally.

`make compose-test` (deploy/compose/compose_test.py) runs the stack for real; these checks
are the fast part that runs with every `make test`."""

from __future__ import annotations

import tomllib
from pathlib import Path, PurePosixPath

import yaml

from api.config.security import AuthSettings, RateLimitSettings
from api.security.front_door import FrontDoor, Refusal
from tests.support import REPO


def load() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text())


def test_services_and_images() -> None:
    services = load()["services"]
    assert set(services) == {"serving", "serving-image", "api-image", "api"}
    # The official image by default, pinned (never `latest`); SERVING_IMAGE selects another.
    assert services["serving"]["image"] == "${SERVING_IMAGE:-tensorflow/serving:2.20.0}"
    assert "build" not in services["serving"]  # a build would overwrite the official tag
    assert services["serving-image"]["profiles"] == ["build"]
    assert services["serving-image"]["build"]["dockerfile"] == "Dockerfile.serving"
    # The stack runs the API image with the example routes; the API image itself is a build only.
    assert services["api-image"]["profiles"] == ["build"]
    assert services["api-image"]["build"] == {"context": ".", "dockerfile": "Dockerfile", "target": "api"}
    assert services["api"]["build"] == {"context": ".", "dockerfile": "Dockerfile", "target": "examples"}
    # Built images carry the project's version, the tag deploy/k8s runs (tests/test_k8s.py).
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert services["api-image"]["image"] == f"tfserve-split/api:{version}"
    assert services["api"]["image"] == f"tfserve-split/api-examples:{version}"
    assert services["serving-image"]["image"] == f"tfserve-split/serving:{version}"


def test_pinned_tf_serving_is_not_older_than_the_checked_exports() -> None:
    # TF Serving 2.20.0 runs TensorFlow 2.20. The examples were exported by TensorFlow 2.21;
    # TensorFlow 2.20's loader (what TF Serving uses: a Session over the SignatureDefs) was
    # checked to load and run both. A re-export with a newer TensorFlow needs that check again.
    from tensorflow.core.protobuf import saved_model_pb2

    checked = {"2.21.0"}
    for model in ("fraud", "digits"):
        saved = saved_model_pb2.SavedModel()
        saved.ParseFromString((REPO / "models" / model / "1" / "saved_model.pb").read_bytes())
        assert saved.meta_graphs[0].meta_info_def.tensorflow_version in checked, model


def test_serving_mounts_models_and_config_and_uses_them() -> None:
    serving = load()["services"]["serving"]
    mounts = {v.split(":")[0]: v.split(":")[1] for v in serving["volumes"]}
    assert mounts["./models"] == "/models"
    config_in_container = mounts["./models.config"]
    assert f"--model_config_file={config_in_container}" in serving["command"]
    monitoring = mounts["./deploy/serving/monitoring.config"]
    assert f"--monitoring_config_file={monitoring}" in serving["command"]
    assert (REPO / "deploy/serving/monitoring.config").is_file()
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
    # A host port range: `--scale api=2` gives each replica a port of its own.
    assert api["ports"] == ["${API_PORTS:-8000-8009}:8000"]
    assert "backend" in api["networks"] and "frontend" in api["networks"]


def test_healthchecks() -> None:
    services = load()["services"]
    for name in ("serving", "api"):
        check = services[name]["healthcheck"]
        # CMD-SHELL: podman 4.3 splits CMD-form arguments on spaces.
        assert check["test"][0] == "CMD-SHELL" and len(check["test"]) == 2
        assert check["interval"] and check["retries"] >= 1 and check["start_period"]
    # serving's check reads the model names from the mounted config (deploy/serving/models-available.sh,
    # tests/test_models_available.py): none are written here.
    serving = services["serving"]
    assert serving["healthcheck"]["test"][1] == "bash /config/models-available.sh /config/models.config 8501"
    assert "./deploy/serving/models-available.sh:/config/models-available.sh:ro" in serving["volumes"]
    assert "fraud" not in serving["healthcheck"]["test"][1]
    assert "/readyz" in services["api"]["healthcheck"]["test"][1]


def test_the_api_service_leaves_model_routes_to_the_image() -> None:
    # compose's environment: beats an image's ENV: naming the examples here would override the
    # routes of an image of one's own (and a route setting of theirs would stop such an API).
    environment = load()["services"]["api"]["environment"]
    assert "MODEL_ROUTES" not in environment and not any(k.startswith("MODELS__") for k in environment)
    assert "MODEL_ROUTES=examples.fraud.route:route,examples.digits.route:route" in " ".join(
        dockerfile_stages()["examples"]
    )


def test_the_own_model_override_mounts_models_config_and_routes() -> None:
    override = yaml.safe_load((REPO / "deploy/compose/own-model.override.yml").read_text())["services"]
    targets = {v.rsplit(":", 2)[1]: v.split(":")[0] for v in override["serving"]["volumes"]}
    # Mount targets the base's volumes use, so compose replaces those mounts with the user's.
    assert targets == {"/models": "${MODELS_DIR", "/config/models.config": "${MODEL_CONFIG_FILE"}
    base_targets = {v.split(":")[1] for v in load()["services"]["serving"]["volumes"]}
    assert set(targets) <= base_targets
    api = override["api"]
    assert api["image"] == "${API_IMAGE:-tfserve-split/api:0.1.0}" and api["build"] == {"target": "api"}
    assert api["environment"]["MODEL_ROUTES"].startswith("${MODEL_ROUTES:?")
    assert api["environment"]["PYTHONPATH"].split(":")[0] == "/routes"
    assert any(v.rsplit(":", 2)[1] == "/routes" for v in api["volumes"])
    assert (REPO / "deploy/compose/no-routes").is_dir()


def dockerfile_stages() -> dict[str, list[str]]:
    """The Dockerfile's stages by name: each stage's lines, from its FROM on."""
    stages: dict[str, list[str]] = {}
    lines: list[str] = []
    for line in (REPO / "Dockerfile").read_text().splitlines():
        line = line.strip()
        if line.startswith("FROM "):
            lines = stages.setdefault(line.split(" AS ")[-1], [])
        if line and not line.startswith("#"):
            lines.append(line)
    return stages


def test_api_image_installs_only_the_api_extras_has_no_example_code_and_runs_as_non_root() -> None:
    stages = dockerfile_stages()
    assert list(stages) == ["api", "examples"]
    lines = stages["api"]
    installs = [line for line in lines if line.startswith("RUN pip install")]
    # The api extra, tracing's (loaded only when an OTEL_* variable turns it on) and auth (JWT: PyJWT).
    assert installs == ["RUN pip install '.[api,api-tracing,auth]'"]
    copied = [line.split()[1] for line in lines if line.startswith("COPY ")]
    assert not any(path.startswith("examples") for path in copied), copied
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    assert not any("tensorflow" in line for line in lines)
    # The api extra carries no dependency of an example's own.
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    api_extras = extras["api"] + extras["api-tracing"] + extras["auth"]
    assert not any(dep.startswith(("pillow", "python-multipart")) for dep in api_extras)
    assert {dep.split(">")[0] for dep in extras["examples"]} == {"pillow", "python-multipart"}


def test_examples_image_adds_the_examples_to_the_api_image_as_a_users_route() -> None:
    lines = dockerfile_stages()["examples"]
    assert lines[0] == "FROM api AS examples"
    assert [line for line in lines if line.startswith("RUN pip install")] == ["RUN pip install '.[examples]'"]
    assert "COPY examples/fraud ./examples/fraud" in lines and "COPY examples/digits ./examples/digits" in lines
    assert not any("own_model" in line for line in lines)
    env = " ".join(lines[lines.index(next(line for line in lines if line.startswith("ENV "))) :])
    assert "PYTHONPATH=/app" in env and "MODEL_ROUTES=examples.fraud.route:route,examples.digits.route:route" in env
    users = [line for line in lines if line.startswith("USER ")]
    assert users[-1] == "USER app"


def test_serving_image_installs_only_the_serving_extra_with_tf_servings_entrypoint() -> None:
    text = (REPO / "Dockerfile.serving").read_text()
    lines = [line.strip() for line in text.splitlines()]
    assert "pip install '.[serving,serving-tracing]'" in text and "[api" not in text
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0")
    assert 'ENTRYPOINT ["/usr/bin/tf_serving_entrypoint.sh"]' in lines
    entrypoint = (REPO / "deploy/serving/tf_serving_entrypoint.sh").read_text()
    # tensorflow/serving's own entrypoint: fixed ports, MODEL_NAME / MODEL_BASE_PATH, "$@".
    assert "--port=8500 --rest_api_port=8501" in entrypoint and '"$@"' in entrypoint
    assert "exec python -m serving" in entrypoint


def test_both_images_copy_the_code_the_tiers_share() -> None:
    # The tiers never import each other; what they share sits beside them and goes into both images.
    for dockerfile, tier in (("Dockerfile", "api"), ("Dockerfile.serving", "serving")):
        copied = " ".join(
            line.split(maxsplit=1)[1]
            for line in (REPO / dockerfile).read_text().splitlines()
            if line.startswith("COPY ")
        )
        for shared in (f"{tier} ./{tier}", "http_hardening ./http_hardening", "cpu_quota.py", "otel_tracing.py"):
            assert shared in copied, f"{dockerfile} does not copy {shared.split()[0]}"


def test_api_requires_a_key_from_the_mounted_key_folder(tmp_path: Path) -> None:
    api = load()["services"]["api"]
    env = api["environment"]
    assert env["AUTH__ENABLED"] == "true"
    key_file = PurePosixPath(env["AUTH__API_KEYS_FILE"])
    # The folder is mounted, read-only (a mounted file would keep its old inode after a rename).
    (volume,) = [v for v in api["volumes"] if v.rsplit(":", 2)[1] == str(key_file.parent)]
    host, _, mode = volume.rsplit(":", 2)
    assert host == "${API_AUTH_DIR:-./deploy/compose/auth}" and mode == "ro"
    committed = REPO / "deploy" / "compose" / "auth" / key_file.name
    assert committed.stat().st_mode & 0o044 == 0o044  # readable by the container's user
    # The committed file loads and lists no key: nothing but the probes answers until one is added.
    door = FrontDoor(AuthSettings(enabled=True, api_keys_file=committed), RateLimitSettings())
    assert door.api_keys is not None and not door.api_keys.keys
    assert door.check("/readyz", [], None) is None and "/readyz" in api["healthcheck"]["test"][1]
    assert isinstance(door.check("/v1/fraud/score", [], None), Refusal)
