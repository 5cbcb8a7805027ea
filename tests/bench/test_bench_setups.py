"""Which split variants exist, the request mix, CPU pinning, and the ceiling app."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Literal

import orjson
import pytest
from fastapi.testclient import TestClient

from api.examples.fraud.schemas import Transaction
from bench.__main__ import default_pinning
from bench.apps import ceiling
from bench.setups import all_setups, split_variants
from bench.workload import body_pool


@dataclass
class Field:
    """Stands in for pydantic's FieldInfo: only `.annotation` is read."""

    annotation: Any


def by_name(fields: dict[str, Any]) -> dict[str, Any]:
    return {s.name: s for s in split_variants(fields)}


def test_rest_only_api() -> None:
    variants = by_name({"serving_url": Field(str)})
    assert variants["split-rest"].available
    assert variants["split-rest"].env == {}
    for name in ("split-grpc", "split-rest-coalescing", "split-grpc-coalescing"):
        assert not variants[name].available
        assert variants[name].unavailable_reason.startswith("not available yet")


def test_grpc_and_coalescing_fields() -> None:
    variants = by_name(
        {
            "serving_protocol": Field(Literal["rest", "grpc"]),
            "serving_grpc_targets": Field(list[str]),
            "coalescing_enabled": Field(bool),
            "events_jsonl_path": Field(str),
        }
    )
    assert all(v.available for v in variants.values())
    grpc = variants["split-grpc-coalescing"]
    assert grpc.env == {"SERVING_PROTOCOL": "grpc", "COALESCING_ENABLED": "true"}
    assert grpc.grpc_target_env == "SERVING_GRPC_TARGETS"
    assert grpc.events_path_env == "EVENTS_JSONL_PATH"
    assert variants["split-rest"].env == {"SERVING_PROTOCOL": "rest", "COALESCING_ENABLED": "false"}


def test_grpc_protocol_without_a_target_field_is_not_available() -> None:
    variants = by_name({"serving_protocol": Field(Literal["rest", "grpc"])})
    assert not variants["split-grpc"].available
    assert "target" in variants["split-grpc"].unavailable_reason


def test_the_api_in_this_checkout() -> None:
    names = [s.name for s in all_setups()]
    assert names[:3] == ["ceiling", "naive", "tuned"]  # tuned before the splits: reference load
    assert "split-rest" in names


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [([0], ((), ())), ([0, 1], ((0,), (1,))), ([0, 1, 2, 3], ((0, 1, 2), (3,)))],
)
def test_default_pinning(
    cpus: list[int], expected: tuple[tuple[int, ...], tuple[int, ...]]
) -> None:
    assert default_pinning(cpus) == expected


def test_body_pool_is_valid_varied_and_starts_with_the_id() -> None:
    bodies = body_pool(200)
    assert len(bodies) == 200
    parsed = [orjson.loads(b) for b in bodies]
    for body, raw in zip(parsed, bodies, strict=True):
        Transaction.model_validate(body)
        assert raw.startswith(b'{"transaction_id":"')
    assert len({b["transaction_id"] for b in parsed}) == 200
    assert len(Counter(b["currency"] for b in parsed)) >= 5
    assert len(Counter(b["merchant_category"] for b in parsed)) >= 8
    assert body_pool(200) == bodies  # deterministic


def test_ceiling_app_validates_and_echoes_the_id() -> None:
    body = orjson.loads(body_pool(1)[0])
    with TestClient(ceiling.create_app()) as client:
        answer = client.post("/v1/fraud/score", json=body)
        assert answer.status_code == 200
        assert answer.json()["transaction_id"] == body["transaction_id"]
        assert answer.json()["model"] == {"name": "none", "version": 0}
        bad = client.post("/v1/fraud/score", json={**body, "currency": "XXX"})
        assert bad.status_code == 422
        assert bad.json()["detail"][0]["loc"] == ["body", "currency"]


@pytest.mark.parametrize(("rate", "connections"), [(5.0, 8), (430.0, 22), (5000.0, 64)])
def test_paced_connections_follow_the_rate(rate: float, connections: int) -> None:
    from bench.plan import QUICK

    assert QUICK.paced_connections(rate) == connections
