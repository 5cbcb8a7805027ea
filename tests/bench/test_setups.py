"""Which split variants exist, the request mix, CPU pinning, and the ceiling app."""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import orjson
import pytest
from fastapi.testclient import TestClient

from bench.__main__ import default_pinning, jobs_for
from bench.apps import ceiling
from bench.apps.common import build_app
from bench.plan import FULL, QUICK
from bench.setups import all_setups, custom_variant, split_environment, split_variants
from bench.workload import FRAUD, FRAUD_TRANSFORMER, WORKLOADS, body_pool
from examples.fraud.schemas import Transaction


@dataclass
class Field:
    """Stands in for pydantic's FieldInfo: only `.annotation` and `.default` are read."""

    annotation: Any
    default: Any = None


def by_name(fields: dict[str, Any]) -> dict[str, Any]:
    return {s.name: s for s in split_variants(fields)}


def test_rest_only_api_has_the_headline_split_only() -> None:
    variants = by_name({"serving_url": Field(str)})
    assert variants["split"].available and variants["split"].headline
    assert variants["split"].env == {}  # the product default: nothing set
    for name in ("split-grpc", "split-coalescing", "split-grpc-coalescing"):
        assert not variants[name].available and not variants[name].headline
        assert variants[name].unavailable_reason.startswith("not available yet")


def test_variants_set_one_api_setting_each() -> None:
    variants = by_name(
        {
            "serving_protocol": Field(Literal["rest", "grpc"]),
            "coalescing_enabled": Field(bool),
        }
    )
    assert all(v.available for v in variants.values())
    assert [v.name for v in variants.values() if v.headline] == ["split"]
    assert variants["split"].env == {}
    assert variants["split-coalescing"].env == {"COALESCING_ENABLED": "true"}
    assert variants["split-grpc"].env == {"SERVING_PROTOCOL": "grpc"}
    assert variants["split-grpc-coalescing"].env == {
        "SERVING_PROTOCOL": "grpc", "COALESCING_ENABLED": "true"
    }


def test_coalescing_on_by_default_gives_a_variant_without_it() -> None:
    variants = by_name({"coalescing_enabled": Field(bool, default=True)})
    assert variants["split"].env == {}
    assert variants["split-no-coalescing"].env == {"COALESCING_ENABLED": "false"}
    assert "split-coalescing" not in variants


def test_a_protocol_field_without_grpc_is_not_available() -> None:
    variants = by_name({"serving_protocol": Field(Literal["rest"])})
    assert not variants["split-grpc"].available
    assert "accepts only" in variants["split-grpc"].unavailable_reason


def test_the_api_in_this_checkout() -> None:
    names = [s.name for s in all_setups()]
    assert names[:3] == ["tuned", "ceiling", "naive"]  # tuned first: the SLO and its SLO-RPS
    assert names[3] == "split"
    assert {"split-no-coalescing", "split-grpc"} <= set(names)  # coalescing is the default
    assert names[-2:] == ["bentoml", "ray-serve"]  # the peers


def test_the_split_is_started_by_run_server_with_only_ports_and_files_set(tmp_path: Path) -> None:
    env = split_environment(FRAUD, api_port=1, rest_port=2, grpc_port=3, run_dir=tmp_path, tag="t")
    config = Path(env["MODEL_CONFIG_FILE"]).read_text()
    assert '    name: "fraud"\n' in config and "digits" not in config  # the model tuned loads
    assert env["MODEL_ROUTES"] == "examples.fraud.route:route"  # the route of the one model serving has
    sizing = {"WEB_CONCURRENCY", "SERVING_ARGS", "OMP_NUM_THREADS", "COALESCING_ENABLED",
              "SERVING_PROTOCOL", "MODELS__FRAUD__MODEL_NAME"}
    assert not sizing & env.keys()
    assert (env["API_PORT"], env["REST_API_PORT"], env["GRPC_PORT"]) == ("1", "2", "3")
    assert env["API_HOST"] == "127.0.0.1"


def test_another_workload_is_served_under_the_fraud_route(tmp_path: Path) -> None:
    env = split_environment(FRAUD_TRANSFORMER, api_port=1, rest_port=2, grpc_port=3,
                            run_dir=tmp_path, tag="t")
    assert env["MODELS__FRAUD__MODEL_NAME"] == "fraud_transformer"
    config = Path(env["MODEL_CONFIG_FILE"]).read_text()
    assert '    name: "fraud_transformer"\n' in config  # on its own line: run-server.sh reads it so
    assert f'base_path: "{FRAUD_TRANSFORMER.base_path}"' in config


def test_workloads_share_the_fraud_signature_and_have_a_version() -> None:
    assert set(WORKLOADS) == {"fraud", "fraud-transformer"}
    for workload in WORKLOADS.values():
        assert (workload.version_dir / "saved_model.pb").is_file()
        assert workload.version_dir.parent.name == workload.model_name


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [([0], ((), ())), ([0, 1], ((0,), (1,))), ([0, 1, 2, 3], ((0, 1, 2), (3,)))],
)
def test_default_pinning(
    cpus: list[int], expected: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    assert default_pinning(cpus) == expected


def test_body_pool_is_valid_and_varied() -> None:
    bodies = body_pool(200)
    assert len(bodies) == 200
    parsed = [orjson.loads(b) for b in bodies]
    for body in parsed:
        Transaction.model_validate(body)
    assert len({b["transaction_id"] for b in parsed}) == 200
    assert len(Counter(b["currency"] for b in parsed)) >= 5
    assert len(Counter(b["merchant_category"] for b in parsed)) >= 8
    assert body_pool(200) == bodies  # deterministic


def test_ceiling_app_is_the_api_without_a_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVENTS_JSONL_PATH", str(tmp_path / "events.jsonl"))
    body = orjson.loads(body_pool(1)[0])
    with TestClient(ceiling.create_app()) as client:
        answer = client.post("/v1/fraud/score", json=body)
        assert answer.status_code == 200
        assert answer.json()["transaction_id"] == body["transaction_id"]
        assert answer.json()["model"] == {"name": "none", "version": 1}
        assert answer.json()["fraud_score"] == 0.0
        # The API's own middleware answered: its request id and timing headers.
        assert answer.headers["x-request-id"] and "serving;dur=" in answer.headers["server-timing"]
        assert client.get("/readyz").status_code == 200
        bad = client.post("/v1/fraud/score", json={**body, "currency": "XXX"})
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["body", "currency"]


def test_jobs_of_the_quick_plan_and_a_custom_variant() -> None:
    setups = [*all_setups(), custom_variant({"SERVING_ARGS": "--enable_batching"})]
    jobs = jobs_for(QUICK, [FRAUD, FRAUD_TRANSFORMER], setups, [],
                    also=["split+SERVING_ARGS=--enable_batching"])
    names = [(j.workload.name, j.setup.name) for j in jobs]
    assert names == [
        ("fraud", "tuned"), ("fraud", "ceiling"), ("fraud", "naive"), ("fraud", "split"),
        ("fraud", "bentoml"), ("fraud", "ray-serve"), ("fraud", "split+SERVING_ARGS=--enable_batching"),
        ("fraud-transformer", "tuned"), ("fraud-transformer", "split"),
        ("fraud-transformer", "bentoml"), ("fraud-transformer", "ray-serve"),
        ("fraud-transformer", "split+SERVING_ARGS=--enable_batching"),
    ]
    # What the memory targets compare: the ceiling's memory is the full plan's only.
    assert [j.setup.name for j in jobs if j.memory] == ["tuned", "naive", "split", "bentoml", "ray-serve"]
    full = jobs_for(FULL, [FRAUD], setups, [])
    assert {"ceiling", "split", "split-no-coalescing"} <= {j.setup.name for j in full if j.memory}
    assert setups[-1].env == {"SERVING_ARGS": "--enable_batching"} and not setups[-1].headline


@pytest.mark.parametrize("settings", [{}, {"NOT-A-NAME": "1"}, {"1X": "1"}])
def test_custom_variants_need_environment_names(settings: dict[str, str]) -> None:
    with pytest.raises(ValueError):
        custom_variant(settings)


def test_in_process_apps_collect_before_they_serve(monkeypatch: pytest.MonkeyPatch) -> None:
    """The naive and tuned apps run a full collection at start (bench.apps.common.settled), so
    a memory snapshot sees the settled state whether or not the warm-up triggered one."""
    import gc

    calls: list[int] = []
    monkeypatch.setattr(gc, "collect", lambda *a: calls.append(1) or 0)

    async def handler() -> dict[str, str]:
        return {}

    with TestClient(build_app("settled", handler)) as client:
        assert calls == [1]
        assert client.get("/healthz").status_code == 200


def test_a_cpu_list_outside_this_machine_is_refused_before_the_run() -> None:
    allowed = sorted(os.sched_getaffinity(0))
    beyond = max(allowed) + 64
    for bad in (str(beyond), f"0-{beyond}", "x", ""):
        done = subprocess.run([sys.executable, "-m", "bench", "--server-cpus", bad], capture_output=True,
                              text=True, timeout=60, check=False)
        assert done.returncode == 2, done.stderr
        assert "--server-cpus" in done.stderr and "[bench]" not in done.stdout  # nothing started
