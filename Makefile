# slurmgate: Slurm schedules Kubernetes Pods.
#
#   make demo     local Slurm + Kubernetes control plane, deploy, watch a Pod land where Slurm chose
#   make test     install everything needed, lint, unit + e2e tests against the real local cluster
#
# Built control-plane binaries live in ~/.cache/slurmgate (keyed by the versions in
# cluster/versions.env), so only the first run on a machine compiles Kubernetes.

SHELL := /bin/bash
RUN_DIR ?= /tmp/slurmgate
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PY_BOOT ?= python3
APT_PACKAGES := munge slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin
PYTEST_ARGS ?=
BENCH_ARGS ?= --profile

export SLURMGATE_RUN_DIR := $(RUN_DIR)

.PHONY: deps apt venv binaries lint typecheck test test-unit test-e2e test-faults \
        cluster-up cluster-down deploy undeploy demo bench clean

deps: apt venv binaries

apt:
	@missing=""; for p in $(APT_PACKAGES); do \
	  dpkg-query -W -f='$${Status}' $$p 2>/dev/null | grep -q "ok installed" || missing="$$missing $$p"; \
	done; \
	if [ -n "$$missing" ]; then \
	  echo "installing:$$missing"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	fi

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	test -x $(PYTHON) || $(PY_BOOT) -m venv $(VENV)
	$(PYTHON) -m pip install -q --upgrade pip
	$(PYTHON) -m pip install -q -e '.[dev]'
	touch $@

binaries:
	bash cluster/build-binaries.sh >/dev/null

lint: venv
	$(VENV)/bin/ruff check .

typecheck: venv
	$(VENV)/bin/mypy slurmgate webhook binder certs cluster bench

test: deps lint typecheck
	$(PYTHON) -m pytest -q -p no:cacheprovider $(PYTEST_ARGS)

test-unit: venv
	$(PYTHON) -m pytest -q tests/unit $(PYTEST_ARGS)

test-e2e: deps
	$(PYTHON) -m pytest -q tests/e2e $(PYTEST_ARGS)

test-faults: deps
	SLURMGATE_FAULTS=1 $(PYTHON) -m pytest -q -m faults tests/e2e $(PYTEST_ARGS)

cluster-up: deps
	$(PYTHON) -m cluster.local up

cluster-down: venv
	$(PYTHON) -m cluster.bridge down
	$(PYTHON) -m cluster.local down

deploy: venv
	$(PYTHON) -m cluster.bridge up

undeploy: venv
	$(PYTHON) -m cluster.bridge down

demo: deps
	$(PYTHON) -m cluster.demo

bench: deps
	$(PYTHON) -m pip install -q -e '.[dev,bench]'
	$(PYTHON) -m bench.run $(BENCH_ARGS)

clean: cluster-down
	rm -rf $(RUN_DIR) kustomize/overlays/*/generated

include mk/deploy.mk
