"""The fraud example: `POST /v1/fraud/score`, one raw card transaction in, a fraud score out.

Declared with the API's extension point only (`api.model_routes`): the request and
response bodies (`schemas`), the feature definition shared with training (`features`),
the served model's signature, and the score's meaning (`threshold`, this route's one
option: `MODELS__FRAUD__THRESHOLD`).

Signature `serving_default` of models/fraud (see models/train_fraud.py):
    input  `features`     float32 [batch, 11], `features.FEATURE_NAMES` order
    output `fraud_score`  float32 [batch, 1], probability of fraud
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

from api.model_routes import DataType, JsonBody, ModelRoute, PayloadCapture, Prediction, Signature, TensorSpec
from examples.fraud.features import N_FEATURES, extract_features
from examples.fraud.schemas import FraudScore, Transaction


class FraudOptions(BaseModel):
    """The fraud route's own settings."""

    model_config = ConfigDict(extra="forbid")

    threshold: float = Field(default=0.5, ge=0.0, le=1.0, description="Scores at or above this are flagged is_fraud.")


def preprocess(transaction: Transaction, options: FraudOptions) -> dict[str, list[float]]:
    """The transaction's feature vector (pure Python, microseconds: it runs on the loop)."""
    return {"features": extract_features(transaction)}


def postprocess(transaction: Transaction, prediction: Prediction, options: FraudOptions) -> FraudScore:
    """The score, flagged at or above the threshold."""
    score = float(prediction.outputs["fraud_score"][0])
    return FraudScore(
        transaction_id=transaction.transaction_id,
        fraud_score=score,
        is_fraud=score >= options.threshold,
        model=prediction.model,
    )


route: ModelRoute[Transaction, FraudScore, FraudOptions] = ModelRoute(
    name="fraud",
    path="/v1/fraud/score",
    summary="Score one raw card transaction for fraud.",
    request=JsonBody(Transaction),
    response=FraudScore,
    signature=Signature(
        model_name="fraud",
        inputs={"features": TensorSpec(DataType.DT_FLOAT, (N_FEATURES,))},
        outputs={"fraud_score": TensorSpec(DataType.DT_FLOAT, (1,), bounds=(0.0, 1.0))},
    ),
    preprocess=preprocess,
    postprocess=postprocess,
    options=FraudOptions,
    input_id=lambda transaction: transaction.transaction_id,
    event_fields=lambda transaction, answer: {"is_fraud": answer.is_fraud},
    # During a canary one card holder sees one model version.
    rollout_key=lambda transaction: transaction.user_id,
    # Captured payloads (MODELS__FRAUD__CAPTURE_SAMPLE_RATE, PAYLOAD_CAPTURE__URL) never carry who paid.
    capture=PayloadCapture(redact=("user_id",)),
)
