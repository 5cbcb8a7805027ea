"""A TensorFlow-Serving-compatible model server on the TensorFlow runtime.

Same flags, ``models.config``, REST and gRPC contract (paths, messages, JSON formats, error codes
and texts) as ``tensorflow_model_server``; run it with ``python -m serving``. The folders are TF
Serving's (``tensorflow_serving/...``), each module named after the TF Serving file it follows:

=========================================================  ====================================================
module                                                     follows (``tensorflow_serving/``...): what it holds
=========================================================  ====================================================
``__main__``                                               ``python -m serving`` -> ``model_servers.main``
``apis``                                                   ``apis/*.proto``: ModelSpec, Predict/Classify/Regress/
                                                           MultiInference requests and responses, numpy (pure)
``config.model_server_config``                             ``config/model_server_config.proto``: read, single
                                                           model, ``ServerCore``'s checks
``config.monitoring_config``                               ``config/monitoring_config.proto``: the metrics path
``core.manager``                                           ``core/aspired_versions_manager``, ``basic_manager``,
                                                           ``servable_state_monitor`` + ``ServerCore``'s
                                                           config and labels: versions, loads, request handles
``core.aspired_version_policy``                            ``core/aspired_version_policy``,
                                                           ``availability_preserving_policy`` (pure)
``core.servable_state``                                    ``core/servable_state.h``: ManagerState, health
``core.servable_handle``                                   ``core/servable_handle.h``: a pinned version
``core.version_labels``                                    ``model_servers/server_core.cc``'s label map (pure)
``sources.storage_path.file_system_storage_path_source``   ``sources/storage_path/``: polls ``base_path``
``servables.tensorflow.servable``                          ``servables/tensorflow/servable.h``,
                                                           ``saved_model_bundle_factory``, ``predict_util``
``servables.tensorflow.serving_session``                   ``servables/tensorflow/serving_session``: the
                                                           ``Session`` seam, ``DirectSession``
``servables.tensorflow.predict_impl``                      ``servables/tensorflow/predict_impl``: Predictor
``servables.tensorflow.classifier``                        ``servables/tensorflow/classifier``
``servables.tensorflow.regressor``                         ``servables/tensorflow/regressor``
``servables.tensorflow.multi_inference``                   ``servables/tensorflow/multi_inference``
``servables.tensorflow.inference_call``                    ``servables/tensorflow/util``: what the three share
``servables.tensorflow.inference_runner``                  ``classification_service``, ``regression_service``,
                                                           ``multi_inference_helper``: InferenceRunner
``servables.tensorflow.get_model_metadata_impl``           ``servables/tensorflow/get_model_metadata_impl``
``servables.tensorflow.saved_model_warmup``                ``servables/tensorflow/saved_model_warmup(_util)``
``servables.tensorflow.monitored``                         ``servables/tensorflow/util``'s ``Record*``: the
                                                           wrappers that record the metrics
``batching.batching_session``                              ``batching/batching_session``: BatchingSession,
                                                           its queues and timers
``batching.batching_options``                              ``batching/batching_options``, ``BatchingParameters``
``batching.batching_util``                                 ``batching/batching_util``: merge, split, pad (pure)
``model_servers.main``                                     ``model_servers/main.cc``: command line -> config ->
                                                           server (bad flags/config fail before TF loads)
``model_servers.flags``                                    ``main.cc``'s flags -> ``ServerOptions``
``model_servers.server_config``                            ``server.cc``: the files the flags name, read
``model_servers.server``                                   ``server.cc``: ``build`` (composition root), ``run``
``model_servers.config_reloader``                          ``server.cc``'s ``PollFilesystemAndReloadConfig``
``model_servers.http_server``                              ``model_servers/http_server``: the app, code ->
                                                           HTTP status, uvicorn
``model_servers.http_limits``                              ``util/net_http/server`` (evhttp): the REST
                                                           head and body limits, before parsing
``model_servers.http_rest_api_handler``                    ``model_servers/http_rest_api_handler``
``model_servers.grpc_server``                              ``server.cc``'s gRPC server on ``grpc.aio``
``model_servers.prediction_service_impl``                  ``model_servers/prediction_service_impl``
``model_servers.model_service_impl``                       ``model_servers/model_service_impl``
``model_servers.grpc_status_util``                         ``model_servers/grpc_status_util``: ToGRPCStatus
``model_servers.get_model_status_impl``                    ``model_servers/get_model_status_impl``
``util.errors``                                            ``ServingError``, canonical code -> HTTP status table
``util.json_tensor``                                       ``util/json_tensor``: JSON <-> tensors (pure)
``util.json_example``                                      ``util/json_tensor``'s classify/regress JSON (pure)
``util.rapidjson``                                         ``json_tensor.cc``'s ``ParseJson`` and
                                                           ``JsonValueToDebugString`` (rapidjson; pure)
``util.request_limits``                                    the request limits (ours) and their errors
``util.tensor_proto``                                      TensorFlow's ``tensor.cc``: ``TensorProto`` <-> numpy
``util.proto_codec``                                       ``apis`` protos <-> :mod:`serving.apis` (gRPC codec)
``util.proto_util``                                        ``util/proto_util.h``: ``ParseProtoTextFile``
``util.metrics``                                           TF Serving's Prometheus metrics and exposition
                                                           (``util/prometheus_exporter``)
``util.executor``                                          ``util/executor``: blocking work off the event loop
``util.process_executor``                                  (ours) the REST codec's low-priority worker
                                                           processes (``--rest_api_num_json_processes``)
``util.periodic_function``                                 TensorFlow's ``PeriodicFunction`` (the polls)
``util.lean_import``                                       keeps TensorFlow's optional packages out
``util.malloc_trim``                                       glibc's ``malloc_trim`` after large requests
``protos``                                                 generated code of the protos the wheels lack
=========================================================  ====================================================

The folders are layers, each importing only those below it: ``model_servers`` > ``batching`` >
``servables`` > ``core`` > ``sources`` > ``config`` > ``util`` > ``apis`` | ``protos`` (checked by
import-linter, ``[tool.importlinter]`` in pyproject.toml). Importing this package does nothing: no
TensorFlow import, no argument parsing, no app.
"""

__all__: list[str] = []
