"""`POST /v1/fraud/score`: one raw transaction in, one fraud score out."""

from __future__ import annotations

from fastapi import APIRouter, Request

from api.features import extract_features
from api.schemas import FraudScore, ModelInfo, Transaction
from api.scoring import FraudScorer

router = APIRouter(prefix="/v1/fraud", tags=["fraud"])

_SERVING_FAILURES = {
    502: {"description": "Serving rejected the request."},
    503: {"description": "Serving is unreachable, failing or has no such model."},
    504: {"description": "Serving did not answer within the timeout."},
}


@router.post("/score", response_model=FraudScore, responses=_SERVING_FAILURES)
async def score(transaction: Transaction, request: Request) -> FraudScore:
    """Validate, extract features (pure, on the loop: microseconds), await serving."""
    scorer: FraudScorer = request.app.state.fraud_scorer
    threshold: float = request.app.state.settings.fraud_threshold
    scores = await scorer.score([extract_features(transaction)])
    value = min(1.0, max(0.0, scores.values[0]))
    return FraudScore(
        transaction_id=transaction.transaction_id,
        fraud_score=value,
        is_fraud=value >= threshold,
        model=ModelInfo(name=scorer.model_name, version=scores.version),
    )
