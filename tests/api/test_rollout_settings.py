"""`api.config.rollouts`: targets as text or objects, rollouts in settings and in the rollout file."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from api.config.rollouts import Rollout, RolloutFileError, Target, file_signature, read_rollout_file
from api.config.settings import Settings


@pytest.mark.parametrize(
    ("text", "target"),
    [
        ("latest", Target()),
        ("2", Target(version=2)),
        (2, Target(version=2)),
        ("stable", Target(label="stable")),
        ("fraud_transformer:latest", Target(model_name="fraud_transformer")),
        ("fraud:3", Target(model_name="fraud", version=3)),
        ("fraud:v2.canary", Target(model_name="fraud", label="v2.canary")),
        ('{"model_name": "fraud", "label": "stable"}', Target(model_name="fraud", label="stable")),
        ({"version": 4}, Target(version=4)),
    ],
)
def test_targets_read_as_tf_serving_names_them(text: object, target: Target) -> None:
    assert Target.model_validate(text) == target


@pytest.mark.parametrize("bad", ["", "a/b", "x:y:z", "label with space", True, {"version": 1, "label": "x"}, "-1:x:"])
def test_bad_targets_are_refused(bad: object) -> None:
    with pytest.raises(ValidationError):
        Target.model_validate(bad)


def test_a_canary_weight_needs_a_canary() -> None:
    with pytest.raises(ValidationError, match="no canary target"):
        Rollout(canary_weight=5)
    with pytest.raises(ValidationError):
        Rollout(canary=Target(version=2), canary_weight=101)


def test_a_rollout_from_the_routes_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "MODELS__FRAUD__ROLLOUT__STABLE": "1",
        "MODELS__FRAUD__ROLLOUT__CANARY": "stable",
        "MODELS__FRAUD__ROLLOUT__CANARY_WEIGHT": "12.5",
        "MODELS__FRAUD__ROLLOUT__SHADOW": "fraud_transformer:latest",
        "MODELS__FRAUD__ROLLOUT__SHADOW_RATE": "20",
        "MODELS__FRAUD__ROLLOUT__ALLOW_PINNING": "true",
        "MODELS__FRAUD__THRESHOLD": "0.4",
        "ROLLOUTS__FILE": "/etc/api/rollouts.json",
    }.items():
        monkeypatch.setenv(name, value)
    settings = Settings()
    assert settings.models["fraud"].rollout == Rollout(
        stable=Target(version=1), canary=Target(label="stable"), canary_weight=12.5,
        shadow=Target(model_name="fraud_transformer"), shadow_rate=20, allow_pinning=True,
    )  # fmt: skip
    assert set(settings.models["fraud"].model_extra or {}) == {"threshold"}  # the route's own option, beside it
    assert settings.rollouts.file == Path("/etc/api/rollouts.json")


def test_the_rollout_file(tmp_path: Path) -> None:
    path = tmp_path / "rollouts.json"
    path.write_text('{"fraud": {"stable": "1", "canary": 2, "canary_weight": 10}}')
    assert read_rollout_file(path, ["fraud", "digits"]) == {
        "fraud": Rollout(stable=Target(version=1), canary=Target(version=2), canary_weight=10)
    }
    before = file_signature(path)
    path.write_text('{"fraud": {"stable": "1", "canary": 2, "canary_weight": 0}}')
    assert file_signature(path) != before
    assert file_signature(tmp_path / "missing.json") is None


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{", "is not JSON"),
        ("[]", "must hold a JSON object"),
        ('{"other": {}}', "no route is named 'other' \\(this API serves digits, fraud\\)"),
        ('{"fraud": {"canary_weight": 5}}', "route 'fraud': rollout: Value error, canary_weight is above 0"),
        ('{"fraud": {"stable": "a b"}}', "route 'fraud': stable: Value error, 'a b' is not a target"),
        ('{"fraud": {"weight": 5}}', "route 'fraud': weight: Extra inputs are not permitted"),
    ],
)
def test_a_bad_rollout_file_says_what_is_wrong(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rollouts.json"
    path.write_text(text)
    with pytest.raises(RolloutFileError, match=message):
        read_rollout_file(path, ["fraud", "digits"])
