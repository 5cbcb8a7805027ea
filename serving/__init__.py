"""A TensorFlow-Serving-compatible model server on the TensorFlow runtime.

Same flags, ``models.config``, REST and gRPC contract (paths, messages, JSON formats, error codes
and texts) as ``tensorflow_model_server``; run it with ``python -m serving``. Modules are named
after TF Serving's concepts:

==========================  ========================================================================
``__main__``                command line -> config -> server (bad flags/config fail before TF loads)
``flags``                   tensorflow_model_server's flags -> :class:`~serving.model_servers.flags.ServerOptions`
``config``                  ``ModelServerConfig`` text proto / single-model flags, validated
``source``                  the file-system source: polls ``base_path`` for version directories
``servable``                one SavedModel version in its own Session; runs signatures
``manager``                 versions per model, states, labels, request references, config reloads
``aspired_version_policy``  AvailabilityPreservingPolicy: next load/unload action (pure)
``version_labels``          ``version_labels`` -> label map, TF Serving's availability rule (pure)
``warmup``                  replays ``assets.extra/tf_serving_warmup_requests`` before AVAILABLE
``config_reloader``         ``--model_config_file_poll_wait_seconds``: re-read and reload
``periodic_function``       a function called every N seconds on its own thread (the polls)
``apis``                    numpy request/response types: ModelSpec, PredictRequest/Response
``predict``                 the core both front ends call: ``await Predictor.predict(request)``
``session``                 how tensors get computed: ``Session`` interface, ``DirectSession``
``batching``                ``--enable_batching``: ``BatchingSession`` (queues, timers, threads)
``batch_merge``             merge / split / pad of batched tensors (pure)
``metrics``                 ``--monitoring_config_file``: TF Serving's Prometheus metrics
``classify_regress``        Classify / Regress / MultiInference on serialized tf.Examples (core)
``metadata``                GetModelStatus / GetModelMetadata responses and their REST JSON
``json_tensor``             TF Serving's JSON <-> tensor codec (pure)
``json_example``            JSON <-> tf.Example and classify/regress results (REST codec)
``tensor_proto``            ``TensorProto`` <-> numpy (gRPC tensor codec, ``tensor_content``)
``proto_codec``             ``tensorflow_serving.apis`` messages <-> internal types (gRPC codec)
``errors``                  ``ServingError`` + canonical code -> HTTP status table
``executor``                the one helper that moves blocking work off the event loop
``rest``                    the REST front end (Starlette app, TF Serving's path regexes)
``grpc_service``            the gRPC front end: PredictionService, ModelService on ``grpc.aio``
``server``                  composition root: event loop, front ends, signals, shutdown
``protos``                  generated code of TF Serving config protos the wheel lacks
==========================  ========================================================================

Importing this package does nothing: no TensorFlow import, no argument parsing, no app.
"""

__all__: list[str] = []
