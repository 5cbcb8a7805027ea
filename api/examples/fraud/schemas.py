"""The fraud route's request and response bodies, as pydantic models.

These are also the raw transaction format that `models/transactions.py` generates
for training, so the training data and the live requests go through one parser.
"""

from __future__ import annotations

from typing import Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from api.model_routes import ModelInfo

# ISO 4217 codes the feature extraction has a reference rate for (see
# `features.USD_PER_UNIT`); anything else is rejected with 422 rather than scored
# on an amount whose scale the model never saw.
Currency = Literal["USD", "EUR", "GBP", "INR", "JPY", "CAD", "AUD", "SGD", "BRL", "CHF"]

MerchantCategory = Literal[
    "grocery",
    "restaurants",
    "fuel",
    "pharmacy",
    "utilities",
    "transport",
    "clothing",
    "entertainment",
    "travel",
    "electronics",
    "jewelry",
    "gift_cards",
    "crypto",
    "gambling",
    "money_transfer",
]

DeviceOS = Literal["android", "ios", "web", "windows", "macos", "linux", "other"]


class _Strict(BaseModel):
    """Base for request bodies: unknown fields are errors, not silently dropped."""

    # NaN and Infinity (accepted by the JSON parser) are not amounts or coordinates:
    # reject them as such rather than with a misleading range error.
    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)


class Location(_Strict):
    """A point on Earth in decimal degrees (WGS 84)."""

    lat: float = Field(ge=-90.0, le=90.0, description="Latitude in degrees, -90..90.")
    lon: float = Field(ge=-180.0, le=180.0, description="Longitude in degrees, -180..180.")


class Device(_Strict):
    """The device the transaction was made from."""

    id: str = Field(min_length=1, max_length=128, description="Opaque device identifier.")
    os: DeviceOS = Field(description="Operating system family.")
    is_new: bool = Field(description="True when this user has never used this device before.")


class UserHistory(_Strict):
    """Aggregates over the user's past activity, computed upstream."""

    txn_count_24h: int = Field(ge=0, le=100_000, description="Transactions in the last 24 hours.")
    avg_amount_30d: float = Field(
        ge=0.0, le=1e9, description="Average transaction amount over 30 days, same currency."
    )
    last_location: Location | None = Field(
        default=None, description="Where the previous transaction was made; null if none."
    )
    account_age_days: int = Field(ge=0, le=36_500, description="Days since the account opened.")


class Transaction(_Strict):
    """A raw card transaction to score (`POST /v1/fraud/score`)."""

    transaction_id: str = Field(min_length=1, max_length=128)
    user_id: str = Field(min_length=1, max_length=128)
    amount: float = Field(gt=0.0, le=1e9, description="Amount in `currency` units, > 0.")
    currency: Currency
    merchant_category: MerchantCategory
    timestamp: AwareDatetime = Field(
        description="ISO 8601 with a UTC offset; the hour of day is read in that offset "
        "(the cardholder's local time)."
    )
    device: Device
    location: Location
    user_history: UserHistory


class FraudScore(BaseModel):
    """Response of `POST /v1/fraud/score`."""

    transaction_id: str
    fraud_score: float = Field(ge=0.0, le=1.0, description="Model output, probability of fraud.")
    is_fraud: bool = Field(description="fraud_score >= the configured threshold.")
    model: ModelInfo

