"""The best in-process setup: a Session callable in a sync `def` handler.

Run as the benchmark does (workers = cores, imports preloaded, one TF/OMP thread):

    OMP_NUM_THREADS=1 gunicorn -k uvicorn_worker.UvicornWorker -w 2 --preload \
        'bench.apps.tuned:create_app()'

- The handler is a plain `def`: FastAPI runs it in its threadpool, so the event loop
  keeps accepting and parsing while the model runs.
- The model runs through `tf.compat.v1.Session.make_callable` over the SavedModel's
  `serve` MetaGraph, feeding and fetching the SignatureDef's tensor names — the way
  TF Serving runs a SavedModel, and about 200× cheaper per call than `model.predict`
  (0.28 ms against 55 ms for one row, measured on a 2-core machine).
- `--preload` imports TensorFlow once in the gunicorn master so the workers share those
  pages; the Session (and its thread pools) is created in the lifespan, which runs in
  each worker after fork. A Session created before fork hangs the forked workers at
  their first request (TensorFlow's thread pools do not survive fork).
- One intra-op and one inter-op thread per worker: with workers = cores, more threads
  only contend for the same cores.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import numpy as np
import tensorflow as tf
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


class SessionModel:
    """One SignatureDef of a SavedModel as a callable, run through a TF1-style Session.

    Loads with `tf.compat.v1.saved_model.loader.load` (works for Keras 3 exports and for
    TF1-style SavedModels that `tf.saved_model.load` rejects) and builds one
    `Session.make_callable` from the signature's input to its output tensor. Safe to call
    from several threads at once (Session.run is thread-safe).
    """

    def __init__(self, export_dir: Path, *, threads: int = 1) -> None:
        """Load `export_dir` into a new Session with `threads` intra- and inter-op threads.

        Raises:
            KeyError: the signature, input or output is not in the SavedModel.
        """
        self.pid = os.getpid()
        config = tf.compat.v1.ConfigProto(
            intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads
        )
        self._graph = tf.Graph()
        self._session = tf.compat.v1.Session(graph=self._graph, config=config)
        with self._graph.as_default():
            meta_graph = tf.compat.v1.saved_model.loader.load(
                self._session, [tf.compat.v1.saved_model.tag_constants.SERVING], str(export_dir)
            )
        signature = meta_graph.signature_def[SIGNATURE_NAME]
        feed = self._graph.get_tensor_by_name(signature.inputs[INPUT_KEY].name)
        fetch = self._graph.get_tensor_by_name(signature.outputs[OUTPUT_KEY].name)
        self._run: Callable[[np.ndarray], np.ndarray] = self._session.make_callable(
            fetch, feed_list=[feed]
        )

    def __call__(self, rows: Sequence[Sequence[float]]) -> list[float]:
        """Score rows of shape [n, N_FEATURES] (float32); returns n floats.

        Raises:
            RuntimeError: called in another process than the one that made the Session
                (it was created before a fork and would hang).
        """
        if os.getpid() != self.pid:
            raise RuntimeError("a TF Session cannot be used across fork; create it per worker")
        scores = self._run(np.asarray(rows, dtype=np.float32))  # [n, 1] float32
        return [float(s) for s in scores[:, 0]]

    def close(self) -> None:
        """Release the Session."""
        self._session.close()


@asynccontextmanager
async def _lifespan(app: FastAPI) -> AsyncIterator[None]:
    # Runs in the worker, after gunicorn's fork: the only safe place for a Session.
    path = model_dir()
    model = SessionModel(path, threads=1)
    app.state.model = model
    app.state.model_info = model_info(path)
    model([[0.0] * N_FEATURES])  # warm the callable before the first request
    try:
        yield
    finally:
        model.close()


def score(transaction: Transaction, request: Request) -> FraudScore:
    """Validate, extract features, run the Session callable (in FastAPI's threadpool)."""
    (value,) = request.app.state.model([extract_features(transaction)])
    return to_response(transaction, value, request.app.state.model_info)


def create_app() -> FastAPI:
    """The tuned app. Safe to preload: nothing here creates a Session or a thread."""
    return build_app("tuned: def + Session.make_callable", score, lifespan=_lifespan)
