"""The in-process apps run the real model: tuned's Session path and naive's Keras path
agree with each other, and the tuned app answers in the API's format."""

from __future__ import annotations

import os

import numpy as np
import orjson
import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

from fastapi.testclient import TestClient  # noqa: E402

from bench.apps.common import model_dir, model_version  # noqa: E402
from bench.workload import body_pool  # noqa: E402
from examples.fraud.features import N_FEATURES, extract_features  # noqa: E402
from examples.fraud.schemas import Transaction  # noqa: E402

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

from bench.apps import tuned  # noqa: E402
from bench.apps.naive import load_keras_model  # noqa: E402


def feature_rows(n: int) -> list[list[float]]:
    return [extract_features(Transaction.model_validate_json(b)) for b in body_pool(n)]


def test_session_and_keras_paths_agree() -> None:
    rows = feature_rows(64)
    session_model = tuned.SessionModel(model_dir(), threads=1)
    try:
        via_session = np.array(session_model(rows))
    finally:
        session_model.close()
    via_keras = load_keras_model(model_dir()).predict(np.asarray(rows, np.float32), verbose=0)
    assert via_keras.shape == (64, 1)
    assert via_session.shape == (64,)
    np.testing.assert_allclose(via_session, via_keras[:, 0], rtol=1e-5, atol=1e-6)
    assert ((via_session >= 0) & (via_session <= 1)).all()
    assert via_session.std() > 0  # varied inputs, varied scores


def test_session_model_refuses_another_process() -> None:
    session_model = tuned.SessionModel(model_dir(), threads=1)
    try:
        session_model.pid = -1  # as if this object had crossed a fork
        with pytest.raises(RuntimeError, match="fork"):
            session_model([[0.0] * N_FEATURES])
    finally:
        session_model.close()


def test_tuned_app_answers_like_the_api() -> None:
    raw = body_pool(3)[2]
    body = orjson.loads(raw)
    with TestClient(tuned.create_app()) as client:
        answer = client.post(
            "/v1/fraud/score", content=raw, headers={"content-type": "application/json"}
        )
        model = client.app.state.model  # type: ignore[attr-defined]
        (expected,) = model([extract_features(Transaction.model_validate(body))])
        assert answer.status_code == 200, answer.text
        data = answer.json()
        assert data["transaction_id"] == body["transaction_id"]
        assert data["fraud_score"] == pytest.approx(expected)
        assert data["model"] == {"name": "fraud", "version": model_version(model_dir())}
        assert client.post("/v1/fraud/score", json={"amount": -1}).status_code == 422
