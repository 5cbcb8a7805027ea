"""`POST /v1/fraud/score`: one raw transaction in, one fraud score out."""

from __future__ import annotations

import time

from fastapi import APIRouter, Request

from api.events import EventPublisher, ScoreEvent
from api.features import extract_features
from api.request_context import current_context
from api.schemas import FraudScore, ModelInfo, Transaction
from api.scoring import FraudScorer

router = APIRouter(prefix="/v1/fraud", tags=["fraud"])

# Error answers, all in the shape documented in `api.errors`.
_SERVING_FAILURES: dict[int | str, dict[str, str]] = {
    413: {"description": "Body over MAX_BODY_BYTES (`payload_too_large`)."},
    502: {"description": "Serving rejected the input or answered unusably (`serving_*`)."},
    503: {"description": "Worker overloaded, or serving unreachable or misconfigured."},
    504: {"description": "The request's time budget ran out (`deadline_exceeded`)."},
}


@router.post("/score", response_model=FraudScore, responses=_SERVING_FAILURES)
async def score(transaction: Transaction, request: Request) -> FraudScore:
    """Validate, extract features (pure, on the loop: microseconds), await serving.

    Stages (`api.request_context`): `validate` (FastAPI's body parsing and validation,
    before this runs), `features`, `serving`. The request's deadline (`ctx.deadline`)
    bounds the serving call; a request already past it is answered 504 without calling
    serving (the client checks it before each call). Publishes one `ScoreEvent` per score.
    """
    ctx = current_context()
    ctx.stage_since_start("validate")
    scorer: FraudScorer = request.app.state.fraud_scorer
    threshold: float = request.app.state.settings.fraud_threshold
    with ctx.stage("features"):
        row = extract_features(transaction)
    with ctx.stage("serving"):
        scores = await scorer.score([row], ctx.deadline)
    ctx.set_model(scorer.model_name, scores.version)
    value = scores.values[0]  # in [0, 1]: FraudScorer refuses anything else
    is_fraud = value >= threshold
    events: EventPublisher = request.app.state.events
    events.publish(
        ScoreEvent(
            request_id=ctx.request_id,
            transaction_id=transaction.transaction_id,
            score=value,
            is_fraud=is_fraud,
            model_name=scorer.model_name,
            model_version=scores.version,
            latency_ms=(time.monotonic() - ctx.started) * 1000,
            ts=time.time(),
        )
    )
    return FraudScore(
        transaction_id=transaction.transaction_id,
        fraud_score=value,
        is_fraud=is_fraud,
        model=ModelInfo(name=scorer.model_name, version=scores.version),
    )
