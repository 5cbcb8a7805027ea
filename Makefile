# make run   - create .venv if missing, install, start serving + API on the example models
# make test  - the test suite (what CI runs)
# make model - retrain and re-export the fraud example (models/fraud/1)

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp
API_PORT ?= 8000
REST_API_PORT ?= 8501
GRPC_PORT ?= 8500

.PHONY: install run test model clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[api,serving,dev]'
	@touch $(STAMP)

run: $(STAMP)
	MODELS_DIR=$(CURDIR)/models PYTHON=$(abspath $(PY)) API_PORT=$(API_PORT) \
	REST_API_PORT=$(REST_API_PORT) GRPC_PORT=$(GRPC_PORT) ./run-server.sh

test: $(STAMP)
	$(PY) -m pytest

model: $(STAMP)
	$(PY) -m models.train_fraud --output models/fraud --version 1

clean:
	rm -rf $(VENV) .pytest_cache
