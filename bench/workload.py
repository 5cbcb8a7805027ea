"""The workloads: which model is served, and the request mix every setup is sent.

The bodies come from `models.transactions.generate_transactions` (the generator the
model was trained on, about 5 % fraud), so every setup parses, validates and scores the
same realistic mix of currencies, categories, time zones and histories. Each body is
checked against the API's own schema before it is used: a benchmark of 422 answers
would be worthless.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import orjson

from examples.fraud.features import extract_features
from examples.fraud.schemas import Transaction
from models.transactions import generate_transactions

MODELS_DIR = Path(__file__).resolve().parents[1] / "models"
POOL_SIZE = 512
POOL_SEED = 2026


def body_pool(n: int = POOL_SIZE, seed: int = POOL_SEED) -> list[bytes]:
    """`n` request bodies for `POST /v1/fraud/score`, compact JSON, `transaction_id` first.

    Raises:
        ValueError: a generated body does not validate as `examples.fraud.schemas.Transaction`.
    """
    bodies = []
    for labeled in generate_transactions(n, seed=seed):
        Transaction.model_validate(labeled.body)  # raises ValidationError (a ValueError)
        bodies.append(orjson.dumps(labeled.body))
    return bodies


def write_body_pool(path: Path, n: int = POOL_SIZE, seed: int = POOL_SEED) -> Path:
    """Write `body_pool(n, seed)` to `path`, one JSON document per line; returns `path`."""
    path.write_bytes(b"\n".join(body_pool(n, seed)) + b"\n")
    return path


def feature_pool(n: int = POOL_SIZE, seed: int = POOL_SEED) -> list[list[float]]:
    """The fraud model's input for each body of `body_pool(n, seed)`, in the same order: the
    `features` vector (`examples.fraud.features`, float32-representable, `N_FEATURES` long) the
    route itself would send, for setups that send tensors rather than transactions (OIP's v2).
    """
    return [
        extract_features(Transaction.model_validate(labeled.body))
        for labeled in generate_transactions(n, seed=seed)
    ]


@dataclass(frozen=True)
class Workload:
    """A model the setups serve behind the same fraud route and request mix.

    Every workload takes the fraud model's signature (`features` float32 [batch, 11] ->
    `fraud_score` float32 [batch, 1]), so the API, the in-process apps and the ceiling
    serve it unchanged: the API with `MODELS__FRAUD__MODEL_NAME` set to `model_name`, the
    in-process apps with `BENCH_MODEL_DIR` set to `version_dir`.
    """

    name: str  # what results.json records, e.g. "fraud"
    model_name: str  # the servable's name in serving
    description: str

    @property
    def base_path(self) -> Path:
        """The servable's base path (its versions below it)."""
        return MODELS_DIR / self.model_name

    @property
    def version_dir(self) -> Path:
        """The version the in-process apps load (the highest numbered one)."""
        versions = sorted(
            (p for p in self.base_path.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)
        )
        if not versions:
            raise FileNotFoundError(f"no version under {self.base_path}")
        return versions[-1]


FRAUD = Workload(
    "fraud", "fraud", "the fraud MLP (11 -> 32 -> 16 -> 1), well under 0.1 ms for one row in-process"
)
FRAUD_TRANSFORMER = Workload(
    "fraud-transformer",
    "fraud_transformer",
    "a 48-block Feature-Tokenizer Transformer over the same 11 features, about 2.6 ms for "
    "one row in-process, 0.65 ms per row in batches of 32 (models/train_fraud_transformer.py)",
)
WORKLOADS = {w.name: w for w in (FRAUD, FRAUD_TRANSFORMER)}
