"""The "before" setup: Keras `model.predict` inside an `async def` handler, in every worker.

Run as the benchmark does (3 workers, no `--preload`, so every worker imports
TensorFlow and Keras and loads the model itself):

    gunicorn -k uvicorn_worker.UvicornWorker -w 3 'bench.apps.naive:create_app()'

This is the common first deployment of a Keras model behind FastAPI, kept faithful on
purpose: `model.predict` is a blocking call of tens of milliseconds (it builds a
`tf.data` pipeline and a callback list for every call: 55 ms for one row, measured on a
2-core machine) run
on the event loop, so each worker serves one request at a time and everything else
queues behind it. The model is the SavedModel in TF Serving's layout, wrapped as a
Keras model with `keras.layers.TFSMLayer` so that `.predict` is what runs.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import keras
import numpy as np
from fastapi import FastAPI, Request

from bench.apps.common import (
    INPUT_KEY,
    OUTPUT_KEY,
    SIGNATURE_NAME,
    build_app,
    model_dir,
    model_info,
    to_response,
)
from examples.fraud.features import N_FEATURES, extract_features
from examples.fraud.schemas import FraudScore, Transaction


def load_keras_model(export_dir: Path) -> keras.Model:
    """The SavedModel's `serving_default` signature as a Keras model.

    Input `features` float32 [batch, N_FEATURES]; output `fraud_score` float32 [batch, 1].
    """
    layer = keras.layers.TFSMLayer(str(export_dir), call_endpoint=SIGNATURE_NAME)
    inputs = keras.Input(shape=(N_FEATURES,), name=INPUT_KEY, dtype="float32")
    outputs = layer(inputs)[OUTPUT_KEY]
    return keras.Model(inputs, outputs)


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    path = model_dir()
    app.state.model = load_keras_model(path)
    app.state.model_info = model_info(path)
    yield


async def score(transaction: Transaction, request: Request) -> FraudScore:
    """Validate, extract features, `model.predict` on the event loop (blocking it)."""
    row = np.asarray([extract_features(transaction)], dtype=np.float32)
    prediction = request.app.state.model.predict(row, verbose=0)  # [1, 1] float32
    return to_response(transaction, float(prediction[0, 0]), request.app.state.model_info)


def create_app() -> FastAPI:
    """The naive app; the model is loaded in the lifespan, i.e. in each worker."""
    return build_app("naive: async def + Keras model.predict", score, lifespan=_lifespan)
