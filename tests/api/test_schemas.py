"""Request bodies are strict: each field takes its own JSON type only (examples.fraud.schemas).

Checked through the real app (FastAPI validates the parsed JSON in pydantic's Python
mode, where lax and strict differ from JSON mode), with serving unreachable: a body that
passes validation reaches the serving call and gets 503, one that does not gets 422.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from api.app import create_app
from api.config.settings import Settings
from tests.support import EXAMPLE_ROUTES, REPO

SCORE = "/v1/fraud/score"
EXAMPLE: dict[str, Any] = json.loads((REPO / "examples" / "transaction.json").read_text())


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    settings = Settings(
        model_routes=EXAMPLE_ROUTES.split(","),
        serving_url="http://127.0.0.1:9",
        events_jsonl_path=Path(tmp_path_factory.mktemp("events")) / "events.jsonl",
        serving_max_attempts=1,
    )
    with TestClient(create_app(settings)) as c:
        yield c


def with_field(path: tuple[str, ...], value: object) -> dict[str, Any]:
    body = copy.deepcopy(EXAMPLE)
    target = body
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    return body


@pytest.mark.parametrize(
    ("path", "value", "error_type"),
    [
        (("amount",), True, "float_type"),
        (("amount",), "129.99", "float_type"),
        (("device", "is_new"), "yes", "bool_type"),
        (("device", "is_new"), 1, "bool_type"),
        (("user_history", "txn_count_24h"), "3", "int_type"),
        (("user_history", "txn_count_24h"), 3.5, "int_from_float"),
        (("user_history", "account_age_days"), True, "int_type"),
        (("user_history", "avg_amount_30d"), "80", "float_type"),
        (("location", "lat"), "40.7", "float_type"),
        (("timestamp",), 1764424980, "datetime_type"),
        (("timestamp",), "1764424980", "datetime_type"),
        (("user_id",), 42, "string_type"),
    ],
)
def test_a_value_of_another_json_type_is_422_naming_the_field(
    client: TestClient, path: tuple[str, ...], value: object, error_type: str
) -> None:
    response = client.post(SCORE, json=with_field(path, value))
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["type"] == error_type
    assert error["loc"] == ["body", *path]


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ((), None),  # the example as it is
        (("amount",), 130),  # JSON has one number type: an integer is a number
        (("user_history", "txn_count_24h"), 3.0),  # and 3.0 an integer, as JSON Schema counts them
        (("location", "lat"), 41),
        (("timestamp",), "2026-11-29T14:03:00.250-05:00"),
    ],
)
def test_values_of_their_own_type_pass_validation(client: TestClient, path: tuple[str, ...], value: object) -> None:
    body = with_field(path, value) if path else EXAMPLE
    response = client.post(SCORE, json=body)
    # Valid: the request went on to serving, which is unreachable here.
    assert response.status_code == 503, response.text
    assert response.json()["code"] == "serving_unavailable"
