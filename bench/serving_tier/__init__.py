"""The serving tier alone: ``python -m serving`` on the fraud model, saturated over REST and gRPC.

    python -m bench.serving_tier              # full matrix, about 6 minutes on 2 cores
    python -m bench.serving_tier --quick      # shorter runs
    python -m bench.serving_tier --quick --protocols grpc --one-core-only --rows 1
    python -m bench.serving_tier --profile    # also py-spy the server at gRPC saturation

For every combination of

* server CPUs: 1 core (``taskset -c 0``) and 2 cores (``taskset -c 0,1``);
* batching: ``off``; ``default`` -- ``--enable_batching`` with TF Serving's default parameters
  (no ``--batching_parameters_file``: ``batch_timeout_micros`` 0, so a batch only forms while
  every batch thread is busy; 1-core server only); ``tuned`` -- a parameters file as TF Serving's
  batching guide suggests for CPU throughput (:data:`TUNED_BATCHING`: a 2 ms
  ``batch_timeout_micros``, ``num_batch_threads`` left at the server's CPUs);
* protocol: REST (``:predict``, JSON ``instances``) and gRPC (``PredictionService/Predict``,
  ``tensor_content``);
* request size: 1 row and 256 rows of the model's 11 features;

the server is saturated closed-loop for ``--duration`` seconds after a warm-up, and the run records
answers per second, predictions (rows) per second, latency (what the generator reports: see
below), errors, the server's and the load generator's CPU use (``/proc``, ``getrusage``), the CPU
the rest of the machine used meanwhile (a busy machine lowers every figure; runs where it exceeds
0.25 cores are flagged ``*``), and the mean batch size (from the server's own
``:tensorflow:serving:batching_session:processed_batch_size`` metric). Rows come from
``models.transactions`` through the API's feature extraction, so the model sees realistic inputs.

Load generators, on the CPU the server does not use (CPU 1; with a 2-core server they share it):

* REST: ``bench.loadgen``'s closed loop (the generator ``python -m bench`` uses;
  ``--rest-connections`` connections, one request in flight on each); request bodies cycle
  through a pool of 64. Latency: p50, p99, mean, max.
* gRPC: h2load (Debian package ``nghttp2-client``: ``apt-get install nghttp2-client``), when it
  is on PATH. It is C and event-driven, so it is not the limit: unary gRPC calls are plain
  HTTP/2 POSTs (cleartext, prior knowledge) to ``/tensorflow.serving.PredictionService/Predict``
  with ``content-type: application/grpc`` and ``te: trailers``, whose body is the gRPC
  length-prefixed message (:func:`grpc_frame`). Closed loop: ``--grpc-connections`` connections
  x ``--grpc-streams`` concurrent streams each (default 4 x 8 = 32 in flight, as the REST runs'
  32 connections), ``-D`` seconds after h2load's own ``--warm-up-time``. h2load takes a single
  data file, so **every gRPC request carries the same body** (the first of the pool); batching
  and the model's cost do not depend on the values. h2load prints no latency percentiles, only
  min / max / mean / sd of each request's time: p50 and p99 are ``None`` (``-``) for its runs.
  h2load only sees HTTP statuses, and a gRPC error still arrives with HTTP 200 (``grpc-status``
  is in the trailers), so answers are verified another way: before each run the same body is
  sent once with grpcio and the answer must be OK with ``fraud_score`` float ``[rows, 1]``;
  during the run the server's own ``:tensorflow:serving:request_count`` (by status) is read
  before and after, and any non-OK answer, or fewer Predict calls counted by the server than
  h2load counted answers, flags the run (excluded from the goals; the command exits 1). The
  calls still in flight when h2load stops are cancelled by its closing the connections: up to
  connections x streams CANCELLED are expected and kept apart, not counted as errors.
* gRPC fallback, when h2load is not installed (or with ``--grpc-generator python``): this
  module's own generator (``loadgen`` subcommand), labelled so in the table and the JSON: one
  process, ``grpc.aio``, connections x streams coroutines over one channel, each sending
  pre-serialized requests (the pool of 64) back to back. Python is slow enough to be the limit
  (its ceiling is 3,200-6,200 calls/s here, close to what is measured).

Then the row **serving under a hostile neighbour** (``neighbour``; REST, batching off, 2 cores):
a well-behaved client's one-row ``:predict`` requests at ``--neighbour-rate`` per second (open
loop), quiet and then while another client sends the largest body the server's default limits
allow, back to back; it prints both answers/s and p99 and whether the p99 beside the neighbour
stayed within 2x the quiet one (held / NOT held), and the server's
``--rest_api_num_json_processes`` (its default, or ``--neighbour-json-processes N``).
``--neighbour-rate 0`` skips it; ``--neighbour-only`` runs it alone::

    python -m bench.serving_tier --neighbour-only --quick
    python -m bench.serving_tier --neighbour-only --neighbour-json-processes 0   # for comparison

The ceiling of whichever gRPC generator is used is measured first against a no-op gRPC server
(``null-server`` subcommand, grpc.aio, canned answer, on the server's CPU) and printed beside the
results. That no-op server is Python too: when the generator's CPU in that row is well under one
core, the no-op server, not the generator, was the limit, and the note says so with the
generator's answers per core of its CPU. In every row the ``gen CPU`` column shows how close the
generator was to its one CPU.

Modules: ``workload`` (rows, REST bodies, gRPC requests), ``server`` (starting the server),
``h2load`` and ``grpc_loadgen`` (the gRPC generators), ``grpc_load`` (driving either),
``counters`` (the server's Prometheus counters), ``runs`` (one run each), ``neighbour`` (the
hostile-neighbour row), ``result`` and
``report`` (the table and the goals), ``__main__`` (the command line).

Results: a table on stdout and ``bench/results/serving-tier-<UTC time>.json``. Goals (the serving
issue): >= 3,000 answers/s on one core over gRPC with batching on; >= 100,000 predictions/s with
256-row requests.
"""
