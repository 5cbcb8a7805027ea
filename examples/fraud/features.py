"""The fraud model's feature definition: raw transaction in, feature vector out.

This module is the single definition of the features. The API calls
`extract_features` on every request and `models/train_fraud.py` calls it on every
training row, so training and serving cannot drift. It is pure Python: no
TensorFlow, no NumPy, no I/O, safe to call on the event loop (a few microseconds).

The vector is `FEATURE_NAMES` long, float32-representable, in that order; the
exported model takes it as its `features` input, shape [batch, N_FEATURES], and
normalises it itself (a Keras `Normalization` layer adapted at training time), so
no scaling constants live here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from datetime import datetime

from examples.fraud.schemas import Location, Transaction

# Static reference rates (USD per unit of currency) used only to put amounts from
# different currencies on one scale. They are part of the model's definition: change
# them and the model must be retrained.
USD_PER_UNIT: dict[str, float] = {
    "USD": 1.0,
    "EUR": 1.08,
    "GBP": 1.27,
    "INR": 0.012,
    "JPY": 0.0067,
    "CAD": 0.73,
    "AUD": 0.66,
    "SGD": 0.74,
    "BRL": 0.18,
    "CHF": 1.13,
}

# Merchant categories where card fraud concentrates (resaleable goods and
# hard-to-reverse payments).
RISKY_CATEGORIES: frozenset[str] = frozenset(
    {"electronics", "jewelry", "gift_cards", "crypto", "gambling", "money_transfer"}
)

# Local hours [NIGHT_START, NIGHT_END) count as night.
NIGHT_START_HOUR = 0.0
NIGHT_END_HOUR = 6.0

EARTH_RADIUS_KM = 6371.0088

FEATURE_NAMES: tuple[str, ...] = (
    "log_amount_usd",  # log1p(amount in USD)
    "log_amount_ratio_30d",  # log((amount + 1) / (avg_amount_30d + 1))
    "device_is_new",  # 1.0 / 0.0
    "log_distance_km",  # log1p(great-circle km from last location); 0 if none
    "has_last_location",  # 1.0 if the user has a previous location
    "is_night",  # local hour in [0, 6)
    "hour_sin",  # sin(2*pi*hour/24), local time
    "hour_cos",  # cos(2*pi*hour/24), local time
    "risky_category",  # merchant category in RISKY_CATEGORIES
    "log_txn_count_24h",  # log1p(transactions in the last 24 h)
    "log_account_age_days",  # log1p(account age in days)
)
N_FEATURES = len(FEATURE_NAMES)


def haversine_km(a: Location, b: Location) -> float:
    """Great-circle distance between two points, in kilometres (mean Earth radius)."""
    lat1, lon1, lat2, lon2 = map(math.radians, (a.lat, a.lon, b.lat, b.lon))
    h = (
        math.sin((lat2 - lat1) / 2) ** 2
        + math.cos(lat1) * math.cos(lat2) * math.sin((lon2 - lon1) / 2) ** 2
    )
    return 2 * EARTH_RADIUS_KM * math.asin(min(1.0, math.sqrt(h)))


def local_hour(ts: datetime) -> float:
    """Hour of day in the timestamp's own UTC offset, in [0, 24)."""
    return ts.hour + ts.minute / 60.0 + ts.second / 3600.0


def extract_features(txn: Transaction) -> list[float]:
    """Map one validated transaction to its feature vector.

    Args:
        txn: a validated `Transaction`.

    Returns:
        `N_FEATURES` floats in `FEATURE_NAMES` order.
    """
    history = txn.user_history
    amount_usd = txn.amount * USD_PER_UNIT[txn.currency]
    if history.last_location is None:
        distance_km, has_last = 0.0, 0.0
    else:
        distance_km, has_last = haversine_km(history.last_location, txn.location), 1.0
    hour = local_hour(txn.timestamp)
    angle = 2.0 * math.pi * hour / 24.0
    return [
        math.log1p(amount_usd),
        math.log((txn.amount + 1.0) / (history.avg_amount_30d + 1.0)),
        1.0 if txn.device.is_new else 0.0,
        math.log1p(distance_km),
        has_last,
        1.0 if NIGHT_START_HOUR <= hour < NIGHT_END_HOUR else 0.0,
        math.sin(angle),
        math.cos(angle),
        1.0 if txn.merchant_category in RISKY_CATEGORIES else 0.0,
        math.log1p(history.txn_count_24h),
        math.log1p(history.account_age_days),
    ]


def extract_batch(txns: Sequence[Transaction]) -> list[list[float]]:
    """`extract_features` over a batch: shape [len(txns), N_FEATURES]."""
    return [extract_features(t) for t in txns]
