# One entry per job, the same locally and in CI.
PYTHON ?= python3.11
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
CHECKOV_STAMP := .venv-checkov/.installed
export JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION := 1
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION ?= 20
# One cache outside the checkout for llama-server, the staged image sources and the image tier; exported so
# that every synth (pytest, `npx cdk`, whatever HOME it is given) finds the staged sources.
export LLAMA_SERVER_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/gguf-serve

.PHONY: prereqs demo test test-fast test-scan test-cli test-e2e test-fresh test-images test-images-arm64 test-images-cuda synth lint llama-server image-sources preflight clean

## prereqs: what the commands cannot install themselves, checked first (one line per missing package)
prereqs:
	@scripts/check-prereqs.sh $(PYTHON)

## demo: set up everything, then run the serving path locally (real llama-server, small model)
demo: prereqs $(STAMP) node_modules/.installed llama-server
	$(PY) -m gguf_serve.local.demo

# One pytest marker per tier (pyproject.toml); the opt-in tiers (arm64, cuda, rehearsal) are not part of `test`.
## test: set up everything, then run every tier CI runs: fast, scan, cli, e2e, fresh, images (the x86-64 image in Docker)
test: prereqs test-fast test-scan test-cli test-e2e test-fresh test-images

## test-fast: catalog, synth, cdk-nag, snapshots, moto, units, lint (no llama-server, no Docker, no scanners), in parallel
test-fast: $(STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m fast -n auto

## test-scan: cfn-lint (cn-northwest-1) and checkov over every synthesized template, whole-app option sets included
test-scan: $(STAMP) $(CHECKOV_STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m scan -n auto

## test-cli: `npx cdk synth|bootstrap` as users run them: lock on first synth, a bad option, the CLI's templates
test-cli: $(STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m cli -n auto

## test-e2e: a real llama-server through the production launcher
test-e2e: $(STAMP) llama-server
	$(PY) -m pytest -m e2e

## test-fresh: the set-up steps of `make demo` and `make test` from an empty cache (needs the package registries)
test-fresh: $(STAMP)
	$(PY) -m pytest -m fresh

## test-images: build the x86-64 image from the synthesized asset and run it (installs and starts Docker)
test-images: $(STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m images

## test-images-arm64: the arm64 image under QEMU (opt-in: over an hour on 2 cores)
test-images-arm64: $(STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m arm64

## test-images-cuda: the CUDA image built without a GPU (opt-in: hours of nvcc on 2 cores)
test-images-cuda: $(STAMP) node_modules/.installed image-sources
	$(PY) -m pytest -m cuda

## synth: every stack `cdk deploy` would take now, synthesized; one line for each it would refuse, and why (exit 0).
## SYNTH_ARGS: -c options for this run (as cdk takes them); SYNTH_OUT: the cloud assembly's folder
SYNTH_OUT ?= cdk.out
synth: $(STAMP) node_modules/.installed image-sources
	@stacks="$$($(PY) -m stacks.deployable $(SYNTH_ARGS))" || exit 1; \
	if [ -n "$$stacks" ]; then echo "npx cdk synth --quiet" $$stacks; npx cdk synth --quiet -o $(SYNTH_OUT) $(SYNTH_ARGS) $$stacks; \
	else echo "synth: no stack is deployable yet; each line above says why"; fi

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

llama-server: $(STAMP)
	@PYTHON=$(PY) scripts/build-llama-server.sh >/dev/null

## image-sources: stage the pinned llama.cpp sdist and the image's wheels for `cdk synth`/`cdk deploy`
image-sources: $(STAMP)
	@PYTHON=$(PY) scripts/stage-image-sources.sh >/dev/null

$(STAMP): requirements.txt requirements-dev.txt pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info[:2] == (3, 11), "Python 3.11 is required (see .python-version)"'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip==25.2
	$(PY) -m pip install --quiet -r requirements-dev.txt
	$(PY) -m pip install --quiet --no-deps -e .
	@touch $@

# checkov's own pins conflict with the app's boto3: it gets a venv of its own, installed exactly as frozen.
$(CHECKOV_STAMP): requirements-checkov.txt
	$(PYTHON) -m venv .venv-checkov
	.venv-checkov/bin/python -m pip install --quiet --upgrade pip==25.2
	.venv-checkov/bin/python -m pip install --quiet --no-deps -r requirements-checkov.txt
	@touch $@

## preflight: read-only checks of your AWS account before the first deploy (credentials for the region)
preflight: $(STAMP) node_modules/.installed image-sources
	$(PY) -m gguf_serve.preflight

node_modules/.installed: package.json package-lock.json
	npm ci --no-audit --no-fund
	@touch $@

clean:
	rm -rf $(VENV) .venv-checkov node_modules cdk.out

## rehearse: boot the real user data in a fake instance (systemd, its own Docker) against local stand-ins of
## IMDS, AWS (moto), ECR and ModelScope; builds the x86-64 image as test-images does (opt-in: root and Docker)
.PHONY: rehearse
rehearse: $(STAMP) image-sources
	$(PY) -m pytest -m rehearsal
