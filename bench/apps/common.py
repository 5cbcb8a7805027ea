"""What the in-process comparison apps share: the route, the model's location, the answer.

The route is the API's (`POST /v1/fraud/score`, body `examples.fraud.schemas.Transaction`,
answer `examples.fraud.schemas.FraudScore`), so the load generator sends the same bodies to
every setup and the
answers are the same size. Each app supplies only its handler, because the handler's
kind (`async def` on the loop or `def` in the threadpool) is what is being compared.
"""

from __future__ import annotations

import gc
import os
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from fastapi import FastAPI

from api.model_routes import ModelInfo
from examples.fraud.schemas import FraudScore, Transaction

SCORE_PATH = "/v1/fraud/score"
MODEL_NAME = "fraud"
THRESHOLD = 0.5
# The SavedModel's serving_default signature (see README: input `features` float32
# [batch, 11], output `fraud_score` float32 [batch, 1]).
SIGNATURE_NAME = "serving_default"
INPUT_KEY = "features"
OUTPUT_KEY = "fraud_score"

MODEL_DIR_ENV = "BENCH_MODEL_DIR"
DEFAULT_MODEL_DIR = Path(__file__).resolve().parents[2] / "models" / MODEL_NAME / "1"


def model_dir() -> Path:
    """The SavedModel version directory to load: `$BENCH_MODEL_DIR`, else models/fraud/1.

    Raises:
        FileNotFoundError: the directory has no saved_model.pb.
    """
    path = Path(os.environ.get(MODEL_DIR_ENV) or DEFAULT_MODEL_DIR).resolve()
    if not (path / "saved_model.pb").is_file():
        raise FileNotFoundError(f"no SavedModel at {path} (set {MODEL_DIR_ENV})")
    return path


def model_version(path: Path) -> int:
    """TF Serving's version of a servable directory: its numeric name (`.../fraud/1` → 1)."""
    return int(path.name)


def model_info(path: Path) -> ModelInfo:
    """The answer's `model` for a servable version directory (`.../fraud/1` -> fraud, 1)."""
    return ModelInfo(name=path.parent.name, version=model_version(path))


def to_response(transaction: Transaction, score: float, model: ModelInfo) -> FraudScore:
    """The API's answer for one scored transaction; `score` is clipped to 0..1."""
    value = min(1.0, max(0.0, score))
    return FraudScore(
        transaction_id=transaction.transaction_id,
        fraud_score=value,
        is_fraud=value >= THRESHOLD,
        model=model,
    )


def settled(lifespan: Any = None) -> Callable[[FastAPI], Any]:
    """`lifespan` (if any), then a full garbage collection before the worker serves.

    A forked worker shares the preloaded imports' pages with its master until it writes to
    them, and its first full collection writes to every object it scans: from then on those
    pages are its own. That collection comes sooner or later in any long-running worker;
    running it at start makes every memory snapshot see that settled state, where otherwise
    it depends on whether one happened during the warm-up (measured on the tuned app, one
    worker: 715 MB of PSS before it, 806 MB after). The API freezes its preloaded heap
    before fork instead (gunicorn.conf.py), so its collections copy nothing.
    """

    @asynccontextmanager
    async def run(app: FastAPI) -> AsyncIterator[None]:
        if lifespan is None:
            gc.collect()
            yield
            return
        async with lifespan(app):
            gc.collect()
            yield

    return run


def build_app(title: str, handler: Callable[..., Any], lifespan: Any = None) -> FastAPI:
    """A FastAPI app with `handler` on `POST /v1/fraud/score` and `GET /healthz`.

    Args:
        title: the OpenAPI title, naming the setup.
        handler: the endpoint, `async def` or `def`, taking `transaction: Transaction`
            (and optionally `request: Request`) and returning `FraudScore`.
        lifespan: FastAPI lifespan context manager factory; runs in each worker after
            fork, which is where anything holding threads (a TF Session) must be made.
            It is wrapped in `settled`.
    """
    app = FastAPI(title=title, lifespan=settled(lifespan))
    app.add_api_route(SCORE_PATH, handler, methods=["POST"], response_model=FraudScore)

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
