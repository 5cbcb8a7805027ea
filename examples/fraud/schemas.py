"""The fraud route's request and response bodies, as pydantic models.

These are also the raw transaction format that `models/transactions.py` generates
for training, so the training data and the live requests go through one parser.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal

from pydantic import AwareDatetime, BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

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
    """Base for request bodies: strict types, and unknown fields are errors, not dropped.

    Strict (pydantic's strict mode): each field takes only its own JSON type. A number
    field takes a JSON number (an integer too: JSON has one number type), never `true`
    or a string such as `"129.99"`; an integer field an integral JSON number (`3`, or `3.0`
    as JSON Schema counts integers; not `3.5`, `"3"` or `true`); a boolean `true` or
    `false`, never `"yes"` or `1`; a string field a string. A scoring API must not guess what a malformed
    request meant: a score of `"amount": true` read as 1.0 would be a wrong answer.
    """

    # NaN and Infinity (accepted by the JSON parser) are not amounts or coordinates:
    # reject them as such rather than with a misleading range error.
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


# ISO 8601 / RFC 3339 date and time: YYYY-MM-DDThh:mm[...] (the offset is AwareDatetime's check).
_ISO_DATETIME = re.compile(r"\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}")


def _iso_8601_text(value: object) -> object:
    """Only text in ISO 8601's date-and-time form: not a number of seconds, in JSON or in a string."""
    if not isinstance(value, str) or not _ISO_DATETIME.match(value):
        raise PydanticCustomError(
            "datetime_type", "Input should be an ISO 8601 date and time with a UTC offset, as a string"
        )
    return value


def _json_number(value: object) -> object:
    """Only a JSON number (an int or a float, not a bool or a string): lax int then takes an
    integral float, as JSON Schema's `integer` does, and refuses a fraction."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise PydanticCustomError("int_type", "Input should be a valid integer")
    return value


# An integer as JSON Schema (and so the published OpenAPI schema) defines it: a number with
# no fraction, 3 or 3.0.
Count = Annotated[int, Field(strict=False), BeforeValidator(_json_number)]


# FastAPI validates the parsed JSON in pydantic's Python mode, where a strict datetime takes
# only `datetime` objects: the field is parsed laxly from its string, after the check above.
Timestamp = Annotated[AwareDatetime, Field(strict=False), BeforeValidator(_iso_8601_text)]


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

    txn_count_24h: Count = Field(ge=0, le=100_000, description="Transactions in the last 24 hours.")
    avg_amount_30d: float = Field(
        ge=0.0, le=1e9, description="Average transaction amount over 30 days, same currency."
    )
    last_location: Location | None = Field(
        default=None, description="Where the previous transaction was made; null if none."
    )
    account_age_days: Count = Field(ge=0, le=36_500, description="Days since the account opened.")


class Transaction(_Strict):
    """A raw card transaction to score (`POST /v1/fraud/score`)."""

    transaction_id: str = Field(min_length=1, max_length=128)
    user_id: str = Field(min_length=1, max_length=128)
    amount: float = Field(gt=0.0, le=1e9, description="Amount in `currency` units, > 0.")
    currency: Currency
    merchant_category: MerchantCategory
    timestamp: Timestamp = Field(
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

