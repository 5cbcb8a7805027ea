"""The ceiling: the API's validation and feature extraction, and no model at all.

    gunicorn -k uvicorn_worker.UvicornWorker -w 2 --preload 'bench.apps.ceiling:create_app()'

Same body parsing (`api.examples.fraud.schemas.Transaction`), the same `api.examples.fraud.features.extract_features`
call and the same answer shape as the API, but the score is a constant 0.0 instead of a
call to any model. No setup that runs the model behind this HTTP stack can be faster, so
its RPS is the ceiling the split is measured against. The answer says
`"model": {"name": "none", ...}` so that it can never be mistaken for a real score.
"""

from __future__ import annotations

from fastapi import FastAPI

from api.examples.fraud.features import extract_features
from api.examples.fraud.schemas import FraudScore, Transaction
from api.model_routes import ModelInfo
from bench.apps.common import build_app

NO_MODEL = ModelInfo(name="none", version=0)


async def score(transaction: Transaction) -> FraudScore:
    """Validate and extract features like the API does, then answer without a model."""
    extract_features(transaction)
    return FraudScore(
        transaction_id=transaction.transaction_id,
        fraud_score=0.0,
        is_fraud=False,
        model=NO_MODEL,
    )


def create_app() -> FastAPI:
    """The ceiling app; nothing heavy to load, safe to preload."""
    return build_app("ceiling: validation + features, no model", score)
