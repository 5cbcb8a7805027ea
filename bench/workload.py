"""The request mix: a pool of varied raw transactions, as wrk's Lua scripts read it.

The bodies come from `models.transactions.generate_transactions` (the generator the
model was trained on, about 5 % fraud), so every setup parses, validates and scores the
same realistic mix of currencies, categories, time zones and histories. Each body is
checked against the API's own schema before it is used: a benchmark of 422 answers
would be worthless.
"""

from __future__ import annotations

from pathlib import Path

import orjson

from api.examples.fraud.schemas import Transaction
from models.transactions import generate_transactions

POOL_SIZE = 512
POOL_SEED = 2026


def body_pool(n: int = POOL_SIZE, seed: int = POOL_SEED) -> list[bytes]:
    """`n` request bodies for `POST /v1/fraud/score`, compact JSON, `transaction_id` first.

    The paced Lua script replaces the `transaction_id` value per request, so the key must
    be present in every body (it is the first key the generator writes).

    Raises:
        ValueError: a generated body does not validate as `api.examples.fraud.schemas.Transaction`.
    """
    bodies = []
    for labeled in generate_transactions(n, seed=seed):
        Transaction.model_validate(labeled.body)  # raises ValidationError (a ValueError)
        body = orjson.dumps(labeled.body)
        if not body.startswith(b'{"transaction_id":"'):
            raise ValueError("generated body does not start with its transaction_id")
        bodies.append(body)
    return bodies


def write_body_pool(path: Path, n: int = POOL_SIZE, seed: int = POOL_SEED) -> Path:
    """Write `body_pool(n, seed)` to `path`, one JSON document per line; returns `path`."""
    path.write_bytes(b"\n".join(body_pool(n, seed)) + b"\n")
    return path
