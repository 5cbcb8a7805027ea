# make run   - create .venv if missing, install, start serving + API on the example models
# make test  - ruff, the import contracts (lint-imports), the type check (mypy) and the test suite (what CI runs)
# make model - retrain and re-export the examples (models/fraud/1, models/digits/1,
#              models/fraud_transformer/1)
# make doctor - check the CPU budget of both tiers, blocking async endpoints, gunicorn preload
# make import-graph - modules, import edges and cycles of api/, serving/ and examples/; modules per folder and
#                     the layer each folder sits in (from the import contracts); the ten largest modules
# make protos - regenerate the API's TF Serving protos (api/protos/*_pb2*.py, their .pyi stubs) from the .proto files
# make docs - build the docs site (mkdocs.yml, docs/) into site/ with --strict; make test builds it too
# make chaos - the API under faults and hostile clients (real processes, loopback, ~2 min): a table per fault
# make bench - throughput at each workload's p99 SLO: naive, tuned in-process, split, ceiling and the peers
#              (BentoML, Ray Serve), 3 searches each; quick plan (<= 12 min on 2 cores, + ~1.5 min once for
#              the peers' venvs)
# make bench-peers - install the peers' venvs (.venv-peers/, pinned; make bench does it when missing)
# make bench-hop - the split's hop at low load: transports, CPU and wake-ups per request, py-spy (~2 min)
# make bench-tracing - CPU per request of each tier with tracing off, on at 1 % and at 100 % sampling (~2 min)
# make bench-oip - the fraud model through its route, v2 JSON and v2 binary: CPU per request of each tier, SLO-RPS (3-6 min)
# make bench-full - the same benchmark, full plan (every split variant, longer steps, finer search)
# make compose-test - docker-compose.yml for real: build, up, score, scale serving to 3 under load, stop one,
#                     down (Docker, else podman from Debian's packages; ~8 min on a fresh machine)
# make bench-overload - goodput vs offered load (0.5x..4x of measured capacity): split, tuned, naive (~6 min)
# make bench-front-door - CPU per request of authentication and rate limits (process time, meaningful on a busy box)
# make bench-serving - the serving tier alone: REST/gRPC, batching off/on, 1/2 cores (~6 min; h2load for
#                      gRPC: apt-get install nghttp2-client, else a slower Python generator)
# make rollout-demo - both tiers, fraud v1 and v2, open-loop load, canary 0 -> 10 -> 50 -> 100 -> 0 %: a table per step (~1 min)

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
API_PORT ?= 8000
REST_API_PORT ?= 8501
GRPC_PORT ?= 8500
# What the /models/ prefix of the model config's base paths stands for (run-server.sh).
MODELS_DIR ?= $(CURDIR)/models
# The example routes (examples/), which run-server.sh (make run) serves by default too.
EXAMPLE_ROUTES := examples.fraud.route:route,examples.digits.route:route

.PHONY: install run test docs chaos compose-test model protos doctor import-graph bench bench-full bench-peers bench-hop bench-tracing bench-oip bench-serving bench-front-door bench-overload rollout-demo clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[api,auth,docs-ui,serving,examples,dev,bench,api-tracing,serving-tracing]'
	@touch $(STAMP)

# Ctrl-C stops run-server.sh and make exits 0 (tools/foreground.py says why it is needed).
# `exec`: on SIGTERM GNU make sends SIGTERM to its recipe's process only, waits for it, then
# ends itself by the signal. Without exec that process is /bin/sh -c (the variable assignments
# make it use a shell, and dash does not exec the line's last command): the shell died and
# foreground.py, run-server.sh and both tiers were left running. With exec, make's SIGTERM
# reaches foreground.py (terminal) or run-server.sh (none), and make waits for the clean stop.
run: $(STAMP)
	exec env MODELS_DIR=$(MODELS_DIR) PYTHON=$(abspath $(PY)) API_PORT=$(API_PORT) \
	REST_API_PORT=$(REST_API_PORT) GRPC_PORT=$(GRPC_PORT) $(PY) -m tools.foreground ./run-server.sh

test: $(STAMP)
	$(PY) -m ruff check .
	$(VENV)/bin/lint-imports
	$(PY) -m mypy
	$(PY) -m pytest

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

chaos: $(STAMP)
	$(PY) -m tests.chaos

compose-test:
	deploy/compose/compose-test.sh

model: $(STAMP)
	$(PY) -m models.train_fraud --output models/fraud --version 1
	$(PY) -m models.train_digits --output models/digits --version 1
	$(PY) -m models.train_fraud_transformer --output models/fraud_transformer --version 1

protos: $(STAMP)
	$(PY) -m api.protos.generate

doctor: $(STAMP)
	MODEL_ROUTES="$${MODEL_ROUTES:-$(EXAMPLE_ROUTES)}" $(PY) -m api.ops.doctor

import-graph: $(STAMP)
	$(PY) -m tools.import_graph api serving examples

bench: $(STAMP)
	$(PY) -m bench

bench-full: $(STAMP)
	$(PY) -m bench --full

bench-peers: $(STAMP)
	$(PY) -m bench.peers

bench-hop: $(STAMP)
	$(PY) -m bench --hop --workload fraud

bench-tracing: $(STAMP)
	$(PY) -m bench.tracing_cost

bench-oip: $(STAMP)
	$(PY) -m bench.oip_cost

bench-serving: $(STAMP)
	$(PY) -m bench.serving_tier

bench-front-door: $(STAMP)
	$(PY) -m bench.front_door

rollout-demo: $(STAMP)
	$(PY) -m tools.rollout_demo

bench-overload: $(STAMP)
	$(PY) -m bench.overload

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache
