"""A TensorFlow-Serving-compatible model server on the TensorFlow runtime.

Same flags, ``models.config`` and REST contract (paths, JSON formats, error codes and messages) as
``tensorflow_model_server``; run it with ``python -m serving``. Modules are named after TF Serving's
concepts:

================  ==========================================================================
``__main__``      command line -> config -> server (flags and config fail fast, before TF loads)
``flags``         tensorflow_model_server's flags -> :class:`~serving.flags.ServerOptions`
``config``        ``ModelServerConfig`` text proto / single-model flags, validated
``source``        numeric version directories under ``base_path`` + version policy (pure)
``servable``      one SavedModel version in its own Session; runs signatures
``manager``       versions per model, lifecycle states, labels, request references
``apis``          internal request/response types (numpy): ModelSpec, PredictRequest/Response
``predict``       the core both front ends call: ``await Predictor.predict(request)``
``metadata``      GetModelStatus / GetModelMetadata responses and their REST JSON
``json_tensor``   TF Serving's JSON <-> tensor codec (pure)
``errors``        ``ServingError`` + canonical code -> HTTP status table
``executor``      the one helper that moves blocking work off the event loop
``rest``          the REST front end (Starlette app, TF Serving's path regexes)
``server``        composition root: event loop, front ends, signals, shutdown
================  ==========================================================================

Importing this package does nothing: no TensorFlow import, no argument parsing, no app.
"""

__all__: list[str] = []
