"""The API tier: a thin async FastAPI app in front of a TensorFlow Serving tier.

It validates raw requests, turns them into a model's inputs with the routes' own pure
functions and awaits the serving tier over REST or gRPC. It never imports TensorFlow: the
model runs in the serving tier, loaded once. It has no model routes of its own: a deployment
names them (`MODEL_ROUTES`), the examples in `examples/` as any user's.

Each folder is one concern and one layer of the import contract (`api-layers` in
pyproject.toml; `make import-graph` prints them), a module importing only from its own
folder and those below it, top to bottom:

=================================  ===========================================================
layer: folder / module             what it holds
=================================  ===========================================================
1 ``app``                          ``create_app``: the factory and composition root
1 ``http_server/``                 the connections under gunicorn (head limits and timeouts,
                                   connection cap, lingering close, the worker class)
2 ``ops/``                         beside the app: ``cpu_budget`` (workers and threads from the
                                   quota), ``doctor`` (``make doctor``), ``readiness_wait``
3 ``routes/``                      the HTTP endpoints: ``health`` (``/healthz``, ``/readyz``),
                                   ``metrics`` (``/metrics``), ``model_endpoint`` (each model
                                   route's endpoint, built from its declaration)
3 ``oip/``                         the Open Inference Protocol front (REST and gRPC), beside
                                   ``routes`` and independent of them
3b ``rollouts/``                   which of a route's models and versions a request calls:
                                   stable, canary, shadow, pinning, the watched rollout file
4 ``inference/``                   the call to a route's model: ``served_model`` (version
                                   pinning, shedding), ``tensors`` (one example <-> tensors),
                                   ``readiness`` (model, signature and tensors on serving)
5 ``request/``                      one request: ``middleware``, ``context``, ``errors`` (the
                                   error shape and table), ``admission/`` (``rules``: in
                                   flight, time budget, body size; ``in_flight``; ``shedding``)
5b ``security/``                    the front door: ``front_door`` (one check of path, headers
                                   and client), ``api_keys``, ``jwt_tokens``, ``rate_limit``
6 ``observability/``                ``metrics``, ``logging_config``, ``loop_monitor``,
                                   ``events`` (score events), ``wiring`` (made per app)
7 ``config/``                       ``settings`` (the environment), ``enabled_routes``
                                   (``MODEL_ROUTES`` and ``MODELS__<ROUTE>__...``),
                                   ``serving_config`` (serving's model config file)
8 ``model_routes/``                 the extension point: ``ModelRoute`` and its parts (public)
9 ``serving_client/``               the client to serving, usable alone: REST and gRPC,
                                   replicas, discovery, coalescing, errors, its ``Deadline``
10 ``protos/``                      TF Serving's protos, a wire-compatible subset (generated)
=================================  ===========================================================

Where what comes next goes (the rollouts, one route and several served models, sit between
``routes`` and ``inference``): overload admission beside ``request/admission/rules``; tracing in
``observability/``; another front (the Open Inference Protocol) in ``routes/``, calling
``inference`` (and, for gRPC, ``security.front_door`` from its interceptor).
"""
