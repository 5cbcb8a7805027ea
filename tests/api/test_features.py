"""Feature extraction against hand-computed values."""

from __future__ import annotations

import math

import pytest

from examples.fraud.features import FEATURE_NAMES, N_FEATURES, extract_features, haversine_km
from examples.fraud.schemas import Location, Transaction

BASE = {
    "transaction_id": "t-1",
    "user_id": "u-1",
    "amount": 99.0,
    "currency": "USD",
    "merchant_category": "grocery",
    "timestamp": "2026-11-29T14:00:00Z",
    "device": {"id": "d-1", "os": "ios", "is_new": False},
    "location": {"lat": 0.0, "lon": 0.0},
    "user_history": {
        "txn_count_24h": 0,
        "avg_amount_30d": 99.0,
        "last_location": {"lat": 0.0, "lon": 0.0},
        "account_age_days": 0,
    },
}


def features(**changes: object) -> dict[str, float]:
    body = {**BASE, **changes}
    return dict(zip(FEATURE_NAMES, extract_features(Transaction.model_validate(body)), strict=True))


def test_vector_length_and_order() -> None:
    assert N_FEATURES == len(FEATURE_NAMES) == 11
    assert len(extract_features(Transaction.model_validate(BASE))) == N_FEATURES


def test_baseline_values() -> None:
    f = features()
    assert f["log_amount_usd"] == pytest.approx(math.log(100.0))  # log1p(99)
    assert f["log_amount_ratio_30d"] == 0.0  # same as the 30-day average
    assert f["device_is_new"] == 0.0
    assert f["log_distance_km"] == 0.0
    assert f["has_last_location"] == 1.0
    assert f["is_night"] == 0.0
    # 14:00 -> angle 7*pi/6: sin = -1/2, cos = -sqrt(3)/2
    assert f["hour_sin"] == pytest.approx(-0.5)
    assert f["hour_cos"] == pytest.approx(-math.sqrt(3) / 2)
    assert f["risky_category"] == 0.0
    assert f["log_txn_count_24h"] == 0.0
    assert f["log_account_age_days"] == 0.0


def test_currency_is_converted_before_the_log() -> None:
    # 1000 INR at 0.012 USD/INR = 12 USD -> log1p(12) = log(13)
    assert features(amount=1000.0, currency="INR")["log_amount_usd"] == pytest.approx(math.log(13.0))


def test_amount_ratio_to_30_day_average() -> None:
    f = features(amount=999.0, user_history={**BASE["user_history"], "avg_amount_30d": 99.0})
    assert f["log_amount_ratio_30d"] == pytest.approx(math.log(10.0))  # (999+1)/(99+1)


def test_one_degree_of_longitude_at_the_equator() -> None:
    # 2*pi*R/360 with R = 6371.0088 km
    km = 2 * math.pi * 6371.0088 / 360
    assert haversine_km(Location(lat=0, lon=0), Location(lat=0, lon=1)) == pytest.approx(km)
    assert features(location={"lat": 0.0, "lon": 1.0})["log_distance_km"] == pytest.approx(
        math.log1p(km)
    )


def test_no_last_location() -> None:
    f = features(user_history={**BASE["user_history"], "last_location": None})
    assert f["has_last_location"] == 0.0
    assert f["log_distance_km"] == 0.0


@pytest.mark.parametrize(
    ("timestamp", "night", "hour"),
    [
        ("2026-11-29T00:00:00Z", 1.0, 0.0),
        ("2026-11-29T05:59:59Z", 1.0, 5 + 59 / 60 + 59 / 3600),
        ("2026-11-29T06:00:00Z", 0.0, 6.0),
        # 23:30 UTC is 05:00 the next day in +05:30: night in local time
        ("2026-11-29T23:30:00+05:30", 0.0, 23.5),
        ("2026-11-29T05:00:00+05:30", 1.0, 5.0),
    ],
)
def test_hour_is_local_to_the_timestamp_offset(timestamp: str, night: float, hour: float) -> None:
    f = features(timestamp=timestamp)
    assert f["is_night"] == night
    assert f["hour_sin"] == pytest.approx(math.sin(2 * math.pi * hour / 24))
    assert f["hour_cos"] == pytest.approx(math.cos(2 * math.pi * hour / 24))


def test_risky_category_burst_new_device_and_account_age() -> None:
    f = features(
        merchant_category="gift_cards",
        device={"id": "d", "os": "web", "is_new": True},
        user_history={**BASE["user_history"], "txn_count_24h": 9, "account_age_days": 364},
    )
    assert f["risky_category"] == 1.0
    assert f["device_is_new"] == 1.0
    assert f["log_txn_count_24h"] == pytest.approx(math.log(10.0))
    assert f["log_account_age_days"] == pytest.approx(math.log(365.0))
