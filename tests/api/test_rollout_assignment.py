"""`api.rollouts.assignment`: the arm is a stable hash of the key, the split follows the weight."""

from __future__ import annotations

import subprocess
import sys

import pytest

from api.rollouts.assignment import BUCKETS, bucket, choose_arm, in_share

KEYS = [f"user-{i}" for i in range(10_000)]


@pytest.mark.parametrize("weight", [1.0, 5.0, 10.0, 33.3, 50.0, 90.0])
def test_the_split_over_10000_keys_is_within_one_and_a_half_points_of_the_weight(weight: float) -> None:
    canary = sum(choose_arm(key, weight, route="fraud") == "canary" for key in KEYS)
    assert abs(100 * canary / len(KEYS) - weight) <= 1.5


def test_weights_0_and_100_send_everything_one_way() -> None:
    assert {choose_arm(key, 0.0, route="fraud") for key in KEYS} == {"stable"}
    assert {choose_arm(key, 100.0, route="fraud") for key in KEYS} == {"canary"}


def test_a_key_keeps_its_arm_and_a_growing_canary_only_gains_keys() -> None:
    assert all(choose_arm(k, 10.0, route="fraud") == choose_arm(k, 10.0, route="fraud") for k in KEYS)
    at_10 = {k for k in KEYS if choose_arm(k, 10.0, route="fraud") == "canary"}
    at_50 = {k for k in KEYS if choose_arm(k, 50.0, route="fraud") == "canary"}
    assert at_10 < at_50  # a user on the canary at 10 % is on it at 50 %


def test_the_seed_and_the_route_deal_the_keys_out_anew() -> None:
    first = {k for k in KEYS if in_share(k, 10.0, route="fraud")}
    reseeded = {k for k in KEYS if in_share(k, 10.0, route="fraud", seed="2026-12")}
    other_route = {k for k in KEYS if in_share(k, 10.0, route="digits")}
    assert len(first & reseeded) < len(first) / 2 and len(first & other_route) < len(first) / 2


def test_buckets_are_the_same_in_every_process() -> None:
    # Not Python's hash(), which is salted per process: every gunicorn worker must agree.
    code = "from api.rollouts.assignment import bucket; print(bucket('user-42', route='fraud'))"
    other = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "123"}
    )
    assert int(other.stdout) == bucket("user-42", route="fraud")
    assert 0 <= bucket("", route="") < BUCKETS
