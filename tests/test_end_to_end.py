"""The main job end to end: serving tier + API as real processes on loopback.

Raw transactions go into `POST /v1/fraud/score`; the scores must equal the exported
model's own output for the same features, computed here with TensorFlow.
"""

from __future__ import annotations

import copy
import json
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest

from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from models.transactions import generate_transactions
from tests.support import (
    REPO,
    Process,
    Serving,
    free_port,
    http_ok,
    start_api,
    start_example_serving,
    wait_until,
)

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
EXAMPLE = {
    "transaction_id": "t-0001",
    "user_id": "u-42",
    "amount": 129.99,
    "currency": "INR",
    "merchant_category": "electronics",
    "timestamp": "2026-11-29T14:03:00Z",
    "device": {"id": "d-9", "os": "android", "is_new": True},
    "location": {"lat": 12.97, "lon": 77.59},
    "user_history": {
        "txn_count_24h": 3,
        "avg_amount_30d": 80.0,
        "last_location": {"lat": 12.90, "lon": 77.60},
        "account_age_days": 400,
    },
}


@dataclass
class Stack:
    tmp: Path
    serving: Serving
    api: Process
    api_url: str

    def start_serving(self) -> None:
        """Serving again, on the ports it had (the API keeps calling them)."""
        ports = {"port": self.serving.grpc_port, "rest_api_port": self.serving.rest_port}
        self.serving = start_example_serving(self.tmp, "serving-restart.log", **ports)
        self.serving.wait_available("fraud")




@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    tmp = tmp_path_factory.mktemp("e2e")
    api_port = free_port()
    serving = start_example_serving(tmp)
    api = start_api(api_port, serving.rest_url, tmp / "api.log")
    s = Stack(tmp, serving, api, f"http://127.0.0.1:{api_port}")
    try:
        serving.wait_available("fraud")
        api.wait_ready(lambda: http_ok(s.api_url + "/readyz"), 60, "/readyz")
        yield s
    finally:
        api_status = s.api.stop()
        s.serving.stop()
        # uvicorn re-raises the SIGTERM it handled once it has shut down gracefully.
        assert api_status in (0, -signal.SIGTERM), s.api.log()


@pytest.fixture(scope="module")
def reference_model():  # type: ignore[no-untyped-def]
    """The exported model's serving_default signature, run in this process."""
    import tensorflow as tf

    loaded = tf.saved_model.load(str(REPO / "models" / "fraud" / "1"))
    signature = loaded.signatures["serving_default"]

    def run(rows: list[list[float]]) -> np.ndarray:
        x = tf.constant(np.asarray(rows, dtype=np.float32))
        return signature(features=x)["fraud_score"].numpy()[:, 0]

    return run


def test_healthz(stack: Stack) -> None:
    assert httpx.get(stack.api_url + "/healthz").json() == {"status": "ok"}


def test_readyz_names_the_available_version(stack: Stack) -> None:
    r = httpx.get(stack.api_url + "/readyz")
    assert r.status_code == 200
    state = {"ready": True, "signature": "serving_default", "version": 1, "problems": []}
    assert r.json() == {
        "status": "ready",
        "models": {"fraud": {"model": "fraud", **state}, "digits": {"model": "digits", **state}},
    }


def test_scores_equal_the_models_own_output(stack: Stack, reference_model) -> None:  # type: ignore[no-untyped-def]
    labelled = generate_transactions(300, seed=4242, fraud_rate=0.3)
    bodies = [t.body for t in labelled]
    with httpx.Client(base_url=stack.api_url, timeout=10) as client:
        answers = [client.post("/v1/fraud/score", json=b) for b in bodies]
    assert all(a.status_code == 200 for a in answers), [a.text for a in answers[:3]]
    got = np.array([a.json()["fraud_score"] for a in answers])
    rows = [extract_features(Transaction.model_validate(b)) for b in bodies]
    np.testing.assert_allclose(got, reference_model(rows), atol=1e-5)

    for body, answer in zip(bodies, answers, strict=True):
        data = answer.json()
        assert data["transaction_id"] == body["transaction_id"]
        assert data["model"] == {"name": "fraud", "version": 1}
        assert data["is_fraud"] == (data["fraud_score"] >= 0.5)

    is_fraud = np.array([t.is_fraud for t in labelled])
    assert 30 < is_fraud.sum() < 270
    assert got[is_fraud].mean() > got[~is_fraud].mean() + 0.3


def test_readme_example(stack: Stack) -> None:
    r = httpx.post(stack.api_url + "/v1/fraud/score", json=EXAMPLE)
    assert r.status_code == 200
    assert set(r.json()) == {"transaction_id", "fraud_score", "is_fraud", "model"}


def _without(path: str) -> dict:
    body = copy.deepcopy(EXAMPLE)
    *parents, leaf = path.split(".")
    node = body
    for p in parents:
        node = node[p]
    del node[leaf]
    return body


def _with(path: str, value: object) -> dict:
    body = copy.deepcopy(EXAMPLE)
    *parents, leaf = path.split(".")
    node = body
    for p in parents:
        node = node[p]
    node[leaf] = value
    return body


@pytest.mark.parametrize(
    ("body", "field"),
    [
        (_without("amount"), "amount"),
        (_without("user_history.avg_amount_30d"), "avg_amount_30d"),
        (_with("amount", -5.0), "amount"),
        (_with("amount", 0), "amount"),
        (_with("amount", float("nan")), "amount"),  # sent as the bare NaN token
        (_with("location.lon", float("inf")), "lon"),
        (_with("timestamp", "yesterday"), "timestamp"),
        (_with("timestamp", "2026-11-29T14:03:00"), "timestamp"),  # no UTC offset
        (_with("currency", "XYZ"), "currency"),
        (_with("amount", "lots"), "amount"),
        (_with("device", "android"), "device"),
        (_with("device.is_new", "perhaps"), "is_new"),
        (_with("location.lat", 123.0), "lat"),
        (_with("user_history.txn_count_24h", -1), "txn_count_24h"),
        (_with("merchant_category", "weapons"), "merchant_category"),
        (_with("surprise", 1), "surprise"),
    ],
)
def test_invalid_input_is_422(stack: Stack, body: dict, field: str) -> None:
    # json.dumps writes NaN/Infinity as bare tokens (httpx's json= refuses them).
    r = httpx.post(
        stack.api_url + "/v1/fraud/score",
        content=json.dumps(body),
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    errors = r.json()["detail"]
    assert any(field in map(str, e["loc"]) for e in errors), errors


@pytest.mark.parametrize(
    "content", [b"", b"{", b"[]", b"null", b'"a string"', b"\xff\xfe"]
)
def test_malformed_body_is_422(stack: Stack, content: bytes) -> None:
    r = httpx.post(
        stack.api_url + "/v1/fraud/score",
        content=content,
        headers={"content-type": "application/json"},
    )
    assert r.status_code == 422
    assert "detail" in r.json()


def test_serving_down_then_back(stack: Stack) -> None:
    # Runs last in this module: it stops and restarts the serving tier.
    assert stack.serving.stop() == 0, stack.serving.log()
    r = httpx.post(stack.api_url + "/v1/fraud/score", json=EXAMPLE, timeout=10)
    assert r.status_code == 503
    assert "serving" in r.json()["detail"]
    ready = httpx.get(stack.api_url + "/readyz", timeout=10)
    assert ready.status_code == 503 and "detail" in ready.json()

    stack.start_serving()
    wait_until(lambda: http_ok(stack.api_url + "/readyz"), 30, "API /readyz after restart")
    r = httpx.post(stack.api_url + "/v1/fraud/score", json=EXAMPLE, timeout=10)
    assert r.status_code == 200, r.text
