# The two commands: `make demo` runs the main job on the embedded local default,
# `make test` runs the whole suite. Both install what they need into $DEDUP_CACHE
# (default ~/.cache/dedup-operator) and reuse it on later runs.
SHELL := /bin/bash
export DEDUP_CACHE ?= $(HOME)/.cache/dedup-operator
VENV := $(DEDUP_CACHE)/venv
PY := $(VENV)/bin/python

.PHONY: setup setup-python setup-kafka setup-spark setup-kube setup-nodes setup-csi setup-image setup-previous-release test test-unit test-integration lint demo bench clean-cache install.yaml

# The builds side by side once the venv exists: the Go builds of Kubernetes are CPU-bound,
# the image's mostly downloads and layer writes.
setup: setup-python
	@$(MAKE) --no-print-directory -j4 setup-kafka setup-spark setup-kube setup-nodes setup-csi setup-image setup-previous-release

setup-python:
	@bash scripts/setup-python.sh

setup-kafka:
	@bash scripts/setup-kafka.sh

setup-spark: setup-python
	@bash scripts/setup-spark.sh

setup-kube:
	@bash scripts/setup-kube.sh

# What the real nodes need besides kubelet (built by setup-kube): containerd, runc and
# the CNI plugins (apt-get), crictl, and the pause image compiled from the Kubernetes source.
setup-nodes:
	@bash scripts/setup-nodes.sh

# The real nodes' volumes: csi-attacher and csi-provisioner from their Go modules, and
# the project's CSI driver (local/csi-disk), a stand-in for a cloud disk.
setup-csi:
	@bash scripts/setup-csi.sh

# The image from the Dockerfile (podman, on bases made from Debian packages).
setup-image: setup-python
	@bash scripts/setup-image.sh

# The previous release's chart and image (versions.env), built from its commit by the same
# cached build (after this commit's: its bases and most layers are shared): what the upgrade
# test installs. After the Go builds too: beside them, on two cores, it slowed their
# one-at-a-time compiles (a cold set-up of 15.3 min where 10.5 had been).
setup-previous-release: setup-image setup-kube setup-nodes setup-csi
	@bash scripts/setup-previous-release.sh

lint: setup-python
	@echo "== ruff"; $(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .
	@echo "== mypy"; $(VENV)/bin/mypy && $(VENV)/bin/mypy bench/store.py bench/ownership.py bench/worker_throughput.py bench/restart.py bench/audit.py bench/failover.py bench/rebuild.py bench/capacity.py bench/results.py bench/operator_scale.py bench/lease_watch.py bench/before_after.py tests/support/fake_kube.py

test: setup lint
	@bash scripts/test.sh

test-unit: setup-python
	@$(PY) -m pytest -m "not integration" tests

test-integration: setup
	@$(PY) -m pytest -m integration tests

# install.yaml for `kubectl apply` users: the chart rendered with its default values
install.yaml: setup-python setup-kube
	@$(PY) -m dedup_local.chart install.yaml

demo: setup
	@bash scripts/demo.sh

bench: setup
	@$(PY) bench/store.py && $(PY) bench/ownership.py && $(PY) bench/worker_throughput.py && $(PY) bench/restart.py && $(PY) bench/audit.py && $(PY) bench/failover.py

clean-cache:
	rm -rf "$(DEDUP_CACHE)"
