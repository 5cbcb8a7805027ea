"""Synthetic raw card transactions with documented fraud patterns.

Each generated transaction is a dict in exactly the body format of
`POST /v1/fraud/score` (see `examples.fraud.schemas.Transaction`), with a 0/1 fraud label.
Generation is pure Python and deterministic for a given seed, so the training
script, the tests and the benchmark all draw the same kind of traffic.

Fraud patterns. A fraudulent transaction shows each pattern below independently
with the probability in the first column; a legitimate one with the (small)
probability in the second, so no single pattern decides the label:

| pattern                                                  | fraud | legit |
| -------------------------------------------------------- | ----- | ----- |
| amount far above the user's 30-day average (4-25x)       | 0.70  | 0.03  |
| new device                                               | 0.65  | 0.05  |
| far from the last location (another city)                | 0.55  | 0.04  |
| night hours (00:00-06:00 local)                          | 0.50  | 0.06  |
| risky merchant category (electronics, gift cards, ...)   | 0.70  | 0.12  |
| burst: 8-40 transactions in the last 24 h                | 0.45  | 0.03  |
| young account (under 30 days)                            | 0.30  | 0.04  |
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from examples.fraud.features import RISKY_CATEGORIES, USD_PER_UNIT

# (name, lat, lon, UTC offset in minutes, currency)
CITIES: tuple[tuple[str, float, float, int, str], ...] = (
    ("bengaluru", 12.97, 77.59, 330, "INR"),
    ("mumbai", 19.07, 72.88, 330, "INR"),
    ("london", 51.51, -0.13, 0, "GBP"),
    ("new_york", 40.71, -74.01, -300, "USD"),
    ("san_francisco", 37.77, -122.42, -480, "USD"),
    ("paris", 48.86, 2.35, 60, "EUR"),
    ("tokyo", 35.68, 139.69, 540, "JPY"),
    ("sydney", -33.87, 151.21, 660, "AUD"),
    ("sao_paulo", -23.55, -46.63, -180, "BRL"),
    ("singapore", 1.35, 103.82, 480, "SGD"),
    ("toronto", 43.65, -79.38, -300, "CAD"),
    ("zurich", 47.37, 8.54, 60, "CHF"),
)

SAFE_CATEGORIES: tuple[str, ...] = (
    "grocery",
    "restaurants",
    "fuel",
    "pharmacy",
    "utilities",
    "transport",
    "clothing",
    "entertainment",
    "travel",
)
RISKY: tuple[str, ...] = tuple(sorted(RISKY_CATEGORIES))
OSES: tuple[str, ...] = ("android", "ios", "web", "windows", "macos")

# (pattern, P(pattern | fraud), P(pattern | legit)); see the module docstring.
PATTERN_RATES: dict[str, tuple[float, float]] = {
    "high_amount": (0.70, 0.03),
    "new_device": (0.65, 0.05),
    "far_location": (0.55, 0.04),
    "night": (0.50, 0.06),
    "risky_category": (0.70, 0.12),
    "burst": (0.45, 0.03),
    "young_account": (0.30, 0.04),
}

EPOCH = datetime(2026, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class LabeledTransaction:
    """A request body for `POST /v1/fraud/score` and its ground-truth label."""

    body: dict[str, Any]
    is_fraud: bool
    patterns: tuple[str, ...]


def _jitter(rng: random.Random, lat: float, lon: float, km: float) -> tuple[float, float]:
    """A point within about `km` kilometres of (lat, lon)."""
    dlat = rng.uniform(-km, km) / 111.0
    dlon = rng.uniform(-km, km) / (111.0 * max(0.2, math.cos(math.radians(lat))))
    return round(max(-90.0, min(90.0, lat + dlat)), 5), round(((lon + dlon + 180) % 360) - 180, 5)


def _local_time(rng: random.Random, offset_min: int, night: bool) -> str:
    """An ISO 8601 timestamp in 2026 with the city's UTC offset."""
    day = EPOCH + timedelta(days=rng.randrange(0, 330))
    if night:
        hour = rng.uniform(0.0, 6.0)
    else:
        hour = min(23.99, max(6.0, rng.gauss(14.0, 3.5)))
    tz = timezone(timedelta(minutes=offset_min))
    local = datetime(day.year, day.month, day.day, tzinfo=tz) + timedelta(hours=hour)
    return local.replace(microsecond=0).isoformat()


def make_transaction(rng: random.Random, index: int, is_fraud: bool) -> LabeledTransaction:
    """One transaction, fraudulent or not, drawn with `rng`."""
    column = 0 if is_fraud else 1
    patterns = tuple(p for p, rates in PATTERN_RATES.items() if rng.random() < rates[column])
    home = rng.choice(CITIES)
    _, home_lat, home_lon, offset, currency = home
    rate = USD_PER_UNIT[currency]
    avg_usd = math.exp(rng.gauss(math.log(60.0), 0.8))
    avg_local = avg_usd / rate

    if "high_amount" in patterns:
        amount = avg_local * rng.uniform(4.0, 25.0)
    else:
        amount = avg_local * math.exp(rng.gauss(0.0, 0.45))
    last_lat, last_lon = _jitter(rng, home_lat, home_lon, 15.0)
    if "far_location" in patterns:
        away = rng.choice([c for c in CITIES if c[0] != home[0]])
        lat, lon = _jitter(rng, away[1], away[2], 20.0)
    else:
        lat, lon = _jitter(rng, home_lat, home_lon, 25.0)
    category = rng.choice(RISKY if "risky_category" in patterns else SAFE_CATEGORIES)
    txn_count = rng.randint(8, 40) if "burst" in patterns else min(7, int(rng.expovariate(0.6)))
    age = rng.randint(0, 29) if "young_account" in patterns else rng.randint(30, 4000)
    has_last = age > 0 and rng.random() > 0.02

    body: dict[str, Any] = {
        "transaction_id": f"t-{index:07d}",
        "user_id": f"u-{rng.randrange(1, 50_000)}",
        "amount": round(max(0.01, amount), 2),
        "currency": currency,
        "merchant_category": category,
        "timestamp": _local_time(rng, offset, "night" in patterns),
        "device": {
            "id": f"d-{rng.randrange(1, 10**6)}",
            "os": rng.choice(OSES),
            "is_new": "new_device" in patterns,
        },
        "location": {"lat": lat, "lon": lon},
        "user_history": {
            "txn_count_24h": txn_count,
            "avg_amount_30d": round(avg_local, 2),
            "last_location": {"lat": last_lat, "lon": last_lon} if has_last else None,
            "account_age_days": age,
        },
    }
    return LabeledTransaction(body=body, is_fraud=is_fraud, patterns=patterns)


def generate_transactions(
    n: int, *, seed: int = 7, fraud_rate: float = 0.05, start_index: int = 0
) -> list[LabeledTransaction]:
    """`n` labelled transactions; about `fraud_rate` of them fraudulent.

    Deterministic for a given (n, seed, fraud_rate, start_index).
    """
    rng = random.Random(seed)
    return [
        make_transaction(rng, start_index + i, rng.random() < fraud_rate) for i in range(n)
    ]
