"""A model route's rollout in process: the real app (`create_app`) with the fraud example route and
a fake serving client (tests.api.fake_client) with two versions of the fraud model, so arms,
pinning, headers, events, the shadow and `/readyz` are each checked on their own.

Over real processes (gunicorn, serving replicas): tests/test_rollouts.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.config.enabled_routes import RouteConfigError
from api.config.rollouts import Rollout, Target
from api.config.settings import ModelSettings, Settings
from api.serving_client import PredictRequest, ServingInternalError, Tensor
from examples.fraud.route import route as fraud_route
from tests.api.fake_client import FakeClient, FakeModel, signature_info
from tests.api.stack import transactions
from tests.support import wait_until

#: What each fake version answers: version 1 is below the fraud threshold, version 2 above it.
SCORES = {1: 0.25, 2: 0.75, 3: 0.3}


def fraud_model(versions: dict[int, str] | None = None, fail: bool = False) -> FakeModel:
    def answer(request: PredictRequest) -> dict[str, Tensor]:
        if fail:
            raise ServingInternalError("the model raised")
        version = request.model_spec.version or max(SCORES)
        return {"fraud_score": Tensor((1, 1), [SCORES[version]])}

    return FakeModel(
        {"serving_default": signature_info(fraud_route.signature)},
        answer,
        versions=versions or {1: "AVAILABLE", 2: "AVAILABLE"},
    )


def app_with(tmp_path: Path, rollout: Rollout, models: dict[str, FakeModel] | None = None, **settings: Any) -> Any:
    fake = FakeClient(models if models is not None else {"fraud": fraud_model()})
    config = Settings(
        events_jsonl_path=tmp_path / "events.jsonl",
        models={"fraud": ModelSettings(rollout=rollout)},
        **settings,
    )
    return create_app(config, routes=[fraud_route], open_client=fake.opener), fake


@pytest.fixture
def bodies() -> list[dict[str, Any]]:
    return transactions(200)


def score(client: TestClient, body: dict[str, Any], **headers: str) -> Any:
    return client.post("/v1/fraud/score", json=body, headers=headers)


def shadow_count(app: Any, outcome: str) -> float:
    value = app.state.metrics.registry.get_sample_value(
        "api_shadow_requests_total", {"route": "fraud", "outcome": outcome}
    )
    return value or 0.0


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_each_user_keeps_one_arm_and_answers_say_which(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    rollout = Rollout(stable=Target(version=1), canary=Target(version=2), canary_weight=50)
    app, _ = app_with(tmp_path, rollout)
    with TestClient(app) as client:
        seen: dict[str, set[tuple[str, int]]] = {}
        for body in bodies * 2:
            r = score(client, body)
            assert r.status_code == 200, r.text
            arm, version = r.headers["x-model-arm"], r.json()["model"]["version"]
            assert (arm, version) in {("stable", 1), ("canary", 2)}
            assert r.headers["x-model-version"] == str(version)
            assert r.headers["server-timing"].endswith(f"arm;desc={arm}")
            assert r.json()["fraud_score"] == SCORES[version]
            seen.setdefault(body["user_id"], set()).add((arm, version))
        assert all(len(arms) == 1 for arms in seen.values())  # sticky per user_id
        assert {arm for arms in seen.values() for arm in arms} == {("stable", 1), ("canary", 2)}
        metric = app.state.metrics.registry.get_sample_value(
            "api_rollout_request_duration_seconds_count",
            {"route": "/v1/fraud/score", "arm": "canary", "model": "fraud", "version": "2", "status": "200"},
        )
        assert metric == sum(1 for b in bodies * 2 if ("canary", 2) in seen[b["user_id"]])
    assert {(e["arm"], e["model_version"]) for e in events(tmp_path / "events.jsonl")} == {("stable", 1), ("canary", 2)}


def test_pinning_is_refused_unless_the_rollout_allows_it(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    app, _ = app_with(tmp_path, Rollout(stable=Target(version=1)))
    with TestClient(app) as client:
        r = score(client, bodies[0], **{"X-Model-Version": "2"})
        assert r.status_code == 403 and r.json()["code"] == "forbidden"
        assert "does not let clients choose a model version (X-Model-Version)" in r.json()["detail"]
        r = score(client, bodies[0], **{"X-Model-Label": "stable"})
        assert r.status_code == 403 and "X-Model-Label" in r.json()["detail"]


def test_a_pinned_version_is_served_or_not_found(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    app, fake = app_with(tmp_path, Rollout(stable=Target(version=1), allow_pinning=True))
    with TestClient(app) as client:
        r = score(client, bodies[0], **{"X-Model-Version": "2"})
        assert r.status_code == 200 and r.headers["x-model-arm"] == "pinned" and r.json()["model"]["version"] == 2
        r = score(client, bodies[0], **{"X-Model-Version": "9"})
        assert r.status_code == 404 and r.json()["code"] == "not_found"
        assert r.json()["detail"].startswith("fraud:9 is not AVAILABLE on serving")
        for headers in ({"X-Model-Version": "two"}, {"X-Model-Label": "a/b"}, {"X-Model-Version": "-1"}):
            r = score(client, bodies[0], **headers)
            assert r.status_code == 422 and r.json()["code"] == "validation_error", headers
        r = score(client, bodies[0], **{"X-Model-Version": "1", "X-Model-Label": "stable"})
        assert r.status_code == 422 and "cannot both be supplied" in r.text


def test_the_shadow_is_compared_and_never_answers(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    rollout = Rollout(stable=Target(version=1), shadow=Target(version=2))
    app, fake = app_with(tmp_path, rollout)
    with TestClient(app) as client:
        for body in bodies[:20]:
            r = score(client, body)
            assert r.status_code == 200 and r.json()["model"]["version"] == 1 and r.headers["x-model-arm"] == "stable"
        wait_until(lambda: shadow_count(app, "compared") == 20, 10, "20 shadow calls compared")
        registry = app.state.metrics.registry
        pair = {"route": "fraud", "primary": "fraud:1", "shadow": "fraud:2"}
        scores = {**pair, "field": "fraud_score"}
        assert registry.get_sample_value("api_shadow_difference_count", scores) == 20
        assert registry.get_sample_value("api_shadow_difference_sum", scores) == pytest.approx(10.0)
        disagree = {**pair, "field": "is_fraud", "agree": "false"}
        assert registry.get_sample_value("api_shadow_agreements_total", disagree) == 20
    shadows = [e for e in events(tmp_path / "events.jsonl") if e["arm"] == "shadow"]
    assert len(shadows) == 20 and {e["model_version"] for e in shadows} == {2}
    first = shadows[0]["compared_with"]
    assert (first["model_name"], first["model_version"], first["arm"]) == ("fraud", 1, "stable")
    assert first["differences"] == {"fraud_score": 0.5} and first["agreements"]["is_fraud"] is False
    assert [p.model_spec.version for p in fake.predicts].count(2) == 20


@pytest.mark.parametrize(
    "shadow_models",
    [
        pytest.param({}, id="shadow-model-missing"),
        pytest.param({"shadow": fraud_model(fail=True)}, id="shadow-model-erroring"),
    ],
)
def test_a_failing_shadow_changes_nothing_for_the_caller(
    tmp_path: Path, bodies: list[dict[str, Any]], shadow_models: dict[str, FakeModel]
) -> None:
    rollout = Rollout(stable=Target(version=1), shadow=Target(model_name="shadow"))
    app, _ = app_with(tmp_path, rollout, {"fraud": fraud_model(), **shadow_models})
    with TestClient(app) as client:
        for body in bodies[:10]:
            r = score(client, body)
            assert r.status_code == 200 and r.json()["fraud_score"] == SCORES[1]
        wait_until(lambda: shadow_count(app, "failed") == 10, 10, "10 failed shadow calls")
        ready = client.get("/readyz")
        assert ready.status_code == 200  # a shadow never answers: it does not make the route unready
        assert ready.json()["models"]["fraud"]["rollout"]["shadow"]["ready"] is bool(shadow_models)


def test_a_full_shadow_queue_drops_and_counts(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    rollout = Rollout(stable=Target(version=1), shadow=Target(version=2))
    app, _ = app_with(tmp_path, rollout, rollouts={"shadow_max_queue": 1, "shadow_concurrency": 1})
    with TestClient(app) as client:
        mirror = app.state.model_endpoints[0].rollout._mirror
        mirror._tasks[0].cancel()  # nothing takes calls off the queue now
        for body in bodies[:5]:
            assert score(client, body).status_code == 200
        assert shadow_count(app, "dropped_queue_full") == 4 and mirror.queued == 1


def test_readyz_reports_every_target(tmp_path: Path) -> None:
    rollout = Rollout(stable=Target(version=1), canary=Target(version=3), canary_weight=0, shadow=Target(version=2))
    app, _ = app_with(tmp_path, rollout)
    with TestClient(app) as client:
        r = client.get("/readyz")
        assert r.status_code == 200, r.text  # the canary at 0 % does not count
        report = r.json()["models"]["fraud"]
        assert (report["ready"], report["version"]) == (True, 1)
        targets = report["rollout"]
        assert (targets["stable"]["target"], targets["stable"]["ready"]) == ("fraud:1", True)
        assert targets["canary"]["weight"] == 0 and targets["canary"]["problems"] == [
            "version 3 is not AVAILABLE (1: AVAILABLE, 2: AVAILABLE)"
        ]
        shadow = targets["shadow"]
        assert (shadow["target"], shadow["version"], shadow["rate"]) == ("fraud:2", 2, 100)


def test_a_canary_that_is_not_ready_makes_the_route_unready(tmp_path: Path) -> None:
    rollout = Rollout(stable=Target(version=1), canary=Target(version=3), canary_weight=5)
    app, _ = app_with(tmp_path, rollout)
    with TestClient(app) as client:
        r = client.get("/readyz")
        assert r.status_code == 503
        assert r.json()["models"]["fraud"]["problems"] == [
            "canary fraud:3: version 3 is not AVAILABLE (1: AVAILABLE, 2: AVAILABLE)"
        ]


def test_the_rollout_file_overrides_the_settings_and_is_followed(tmp_path: Path, bodies: list[dict[str, Any]]) -> None:
    path = tmp_path / "rollouts.json"
    path.write_text(json.dumps({"fraud": {"stable": 2}}))
    app, _ = app_with(tmp_path, Rollout(stable=Target(version=1)), rollouts={"file": path, "poll_interval_s": 0.05})
    with TestClient(app) as client:
        assert score(client, bodies[0]).json()["model"]["version"] == 2
        path.write_text(json.dumps({"fraud": {"stable": 2, "canary": 1, "canary_weight": 100}}))
        wait_until(lambda: score(client, bodies[0]).json()["model"]["version"] == 1, 10, "the canary at 100 %")
        path.write_text("{not json")
        registry = app.state.metrics.registry
        wait_until(
            lambda: registry.get_sample_value("api_rollout_reloads_total", {"outcome": "invalid"}) == 1,
            10,
            "the bad file seen and refused",
        )
        assert score(client, bodies[0]).json()["model"]["version"] == 1  # the rollout in force stays
        path.unlink()  # back to the route's settings: stable version 1, no canary
        wait_until(lambda: score(client, bodies[0]).headers["x-model-arm"] == "stable", 10, "the settings' rollout")
        assert score(client, bodies[0]).json()["model"]["version"] == 1


def test_a_bad_rollout_file_stops_the_app_at_build_time(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.json"
    path.write_text(json.dumps({"fraud": {"canary_weight": 5}}))
    with pytest.raises(RouteConfigError, match="ROLLOUTS__FILE: .*route 'fraud': rollout: Value error, canary_weight"):
        app_with(tmp_path, Rollout(), rollouts={"file": path})

