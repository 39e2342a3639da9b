# One entry per job, the same locally and in CI.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1

.PHONY: demo test test-fast test-e2e synth lint llama-server clean

## demo: set up everything, then run the serving path locally (real llama-server, small model)
demo: $(STAMP) node_modules/.installed llama-server
	$(PY) -m launcher.local

## test: set up everything, then run every test tier
test: $(STAMP) node_modules/.installed llama-server
	$(PY) -m pytest

## test-fast: catalog, synth, cdk-nag, cfn-lint, snapshots, lint (no llama-server)
test-fast: $(STAMP) node_modules/.installed
	$(PY) -m pytest -m "not e2e"

test-e2e: $(STAMP) llama-server
	$(PY) -m pytest -m e2e

synth: $(STAMP) node_modules/.installed
	npx cdk synth --quiet

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

llama-server: $(STAMP)
	@PYTHON=$(PY) scripts/build-llama-server.sh >/dev/null

$(STAMP): requirements.txt requirements-dev.txt
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (see .python-version)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.2
	$(PY) -m pip install --quiet -r requirements-dev.txt
	@touch $@

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

clean:
	rm -rf $(VENV) node_modules cdk.out
