"""The running stack the OIP tests score against: the serving tier and the API, real processes.

Serving (`python -m serving`) has the example models (fraud, digits), `dtypes` (a string and an
int64 input, and a signature that echoes every OIP datatype: tests/oip/dtypes_model.py) and TF
Serving's `half_plus_two_versions` (two versions, labelled stable and canary:
tests/serving/tf_serving_testdata.py), each exported here. The API runs with the example routes
and `OIP__MODELS=all`, its gRPC front on a free port, once per serving protocol (`oip_stack` is
parametrized: TF Serving's gRPC and REST APIs between the tiers).
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import REPO, Process, Serving, free_port, http_ok, start_api
from tools.processes import start_serving

MODELS = ("fraud", "digits", "dtypes", "half_plus_two_versions")


@dataclass(frozen=True)
class OipStack:
    """Both tiers, running.

    Attributes:
        rest: the API's base URL ("http://127.0.0.1:PORT").
        grpc: the API's OIP gRPC target ("127.0.0.1:PORT").
        serving: the serving tier (its own gRPC target for TF Serving's Predict).
        protocol: how the API calls serving ("grpc" or "rest").
        api: the API process (its log).
    """

    rest: str
    grpc: str
    serving: Serving
    protocol: str
    api: Process

    @property
    def http_host(self) -> str:
        """"127.0.0.1:PORT" of the REST front, as tritonclient takes it."""
        return self.rest.removeprefix("http://")


def _export(root: Path) -> Path:
    """Export the test models under `root`; the models.config naming them and the examples."""
    script = (
        "import sys; from pathlib import Path; sys.path.insert(0, sys.argv[2]);"
        "from tests.oip.dtypes_model import export; from tests.serving.tf_serving_testdata import _half_plus;"
        "root = Path(sys.argv[1]); export(root / 'dtypes' / '1');"
        "_half_plus(root / 'half_plus_two_versions' / '1', 2.0); _half_plus(root / 'half_plus_two_versions' / '2', 3.0)"
    )
    out = subprocess.run(
        [sys.executable, "-c", script, str(root), str(REPO)], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    config = root / "models.config"
    config.write_text(
        "model_config_list {\n"
        f'  config {{ name: "fraud" base_path: "{REPO}/models/fraud" model_platform: "tensorflow" }}\n'
        f'  config {{ name: "digits" base_path: "{REPO}/models/digits" model_platform: "tensorflow" }}\n'
        f'  config {{ name: "dtypes" base_path: "{root}/dtypes" model_platform: "tensorflow" }}\n'
        f'  config {{ name: "half_plus_two_versions" base_path: "{root}/half_plus_two_versions"'
        ' model_platform: "tensorflow"\n'
        "    model_version_policy { all {} }\n"
        '    version_labels { key: "stable" value: 1 }\n'
        '    version_labels { key: "canary" value: 2 }\n'
        "  }\n"
        "}\n"
    )
    return config


@pytest.fixture(scope="session")
def oip_serving(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Serving]:
    """The serving tier with every test model AVAILABLE (both versions of half_plus_two_versions)."""
    root = tmp_path_factory.mktemp("oip-models")
    # Labels name versions that are still loading at start: TF Serving refuses that without the flag.
    serving = start_serving(
        root / "serving.log", model_config_file=_export(root), allow_version_labels_for_unavailable_models=True
    )
    try:
        serving.wait_available(*MODELS)
        serving.wait_for_states("half_plus_two_versions", {1: "AVAILABLE", 2: "AVAILABLE"})
        yield serving
    finally:
        serving.stop()


def start_oip_api(serving: Serving, log: Path, protocol: str, **env: str) -> tuple[Process, str, str]:
    """The API (one uvicorn process) with the OIP front on every model; (process, REST URL, gRPC target)."""
    port, grpc_port = free_port(), free_port()
    api = start_api(
        port,
        serving.rest_url,
        log,
        OIP__MODELS="all",
        OIP__GRPC_PORT=str(grpc_port),
        SERVING_PROTOCOL=protocol,
        SERVING_GRPC_TARGETS=serving.grpc_target,
        **env,
    )
    rest = f"http://127.0.0.1:{port}"
    api.wait_ready(lambda: http_ok(f"{rest}/v2/health/ready"), 60, "the API's OIP front")
    return api, rest, f"127.0.0.1:{grpc_port}"


@pytest.fixture(scope="module", params=["grpc", "rest"])
def oip_stack(
    request: pytest.FixtureRequest, oip_serving: Serving, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OipStack]:
    """The API in front of `oip_serving`, calling it over gRPC or REST (TF Serving's APIs)."""
    protocol = request.param
    log = tmp_path_factory.mktemp(f"oip-api-{protocol}") / "api.log"
    api, rest, grpc_target = start_oip_api(oip_serving, log, protocol)
    try:
        assert httpx.get(f"{rest}/v2/health/live").json() == {"live": True}
        yield OipStack(rest, grpc_target, oip_serving, protocol, api)
    finally:
        api.stop()
