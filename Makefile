# slurmgate: Slurm schedules Kubernetes Pods.
#
#   make demo     local Slurm + Kubernetes control plane, deploy, watch a Pod land where Slurm chose
#   make test     install everything needed, lint (ruff, layer contracts), mypy, unit + e2e tests
#   make image    the slurmgate image (buildah, no Docker or registry) as an OCI archive
#
# SLURM_VERSION (22.05, 24.11 or 26.05; default the newest) picks the local cluster's Slurm:
#   SLURM_VERSION=24.11 make demo;  make test-matrix runs the e2e suite on every one.
#
# Built control-plane binaries and the Debian roots of the newer Slurm releases live in
# ~/.cache/slurmgate (keyed by the versions in cluster/versions.env), so only the first run on
# a machine compiles Kubernetes and debootstraps a root.

SHELL := /bin/bash
RUN_DIR ?= /tmp/slurmgate
VENV ?= .venv
PYTHON ?= $(VENV)/bin/python
PY_BOOT ?= python3
APT_PACKAGES := munge slurmctld slurmd slurm-client slurmrestd slurm-wlm-jwt-plugin slurmdbd \
                mariadb-server containerd runc containernetworking-plugins
PYTEST_ARGS ?=
SLURM_VERSION ?= 26.05
MATRIX ?= 22.05 24.11 26.05
BENCH_ARGS ?= --profile

export SLURMGATE_RUN_DIR := $(RUN_DIR)
export SLURM_VERSION

.PHONY: deps apt venv binaries promtool slurm-root lint typecheck test test-unit test-e2e test-faults \
        test-matrix test-incluster record-fixtures cluster-up cluster-down deploy undeploy demo bench chaos test-chaos clean

deps: apt venv binaries slurm-root promtool

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

# promtool checks the monitoring component's alert rules (tests/unit/test_monitoring.py). Only the
# binary is taken from Debian's prometheus package (unpacked, not installed: no server, no
# daemon), cached outside the checkout.
PROMTOOL ?= $(HOME)/.cache/slurmgate/promtool/promtool
export PROMTOOL
promtool: $(PROMTOOL)
$(PROMTOOL):
	rm -rf $(@D) && mkdir -p $(@D)/deb
	cd $(@D)/deb && { apt-get download prometheus 2>/dev/null || \
	  { apt-get update -qq && apt-get download prometheus; }; }
	dpkg-deb -x $(@D)/deb/prometheus_*.deb $(@D)/deb/root
	cp $(@D)/deb/root/usr/bin/promtool $@ && rm -rf $(@D)/deb

# 22.05 is the host's package (apt above); newer releases run from a cached Debian root
slurm-root:
	@case "$(SLURM_VERSION)" in 22.05) ;; *) bash cluster/build-slurm-root.sh $(SLURM_VERSION) >/dev/null ;; esac

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports

typecheck: venv
	$(VENV)/bin/mypy slurmgate webhook binder certs pinning cluster bench

# UNIT=0 leaves tests/unit out of `make test`: .ci/run runs them first, alone (make test-unit),
# so that a failure shows within a minute, and not a second time here.
UNIT ?= 1
# E2E_SELECT: a marker expression for the e2e tests (default: pyproject's, all but the fault
# variants and the in-cluster modules). .ci/run runs here only the tests that drive host
# processes or whose subject is Kubernetes' side; the others run against the deployed image in
# `make test-incluster`, on the same Slurm, so that CI runs each test once per release.
E2E_SELECT ?=
test: deps lint typecheck
	$(PYTHON) -m pytest -q -p no:cacheprovider $(if $(filter 0,$(UNIT)),--ignore=tests/unit) \
	  $(if $(E2E_SELECT),-m "$(E2E_SELECT)") --durations=15 $(PYTEST_ARGS)

# needs no cluster and no deps beyond the venv: seconds on a warm machine
test-unit: venv promtool
	$(PYTHON) -m pytest -q -p no:cacheprovider tests/unit $(PYTEST_ARGS)

test-e2e: deps
	$(PYTHON) -m pytest -q tests/e2e $(PYTEST_ARGS)

test-faults: deps
	$(PYTHON) -m pytest -q -m faults tests/e2e $(PYTEST_ARGS)

# The e2e suite, fault variants included, on each Slurm release in $(MATRIX), the releases side by
# side, each on its own cluster (tests/matrix.sh); the tests whose subject does not change with
# the release (marked kube_side) ran on 26.05 in `make test`. A release written VERSION@K8S runs on
# that Kubernetes release's control plane, with the kube_side tests marked kube_api
# (MATRIX="24.11@1.30.14 22.05").
test-matrix: deps lint typecheck
	@for v in $(MATRIX); do $(MAKE) --no-print-directory slurm-root SLURM_VERSION=$${v%@*}; \
	  if [[ $$v == *@* ]]; then K8S_VERSION=$${v#*@} bash cluster/build-binaries.sh >/dev/null; fi; done
	bash tests/matrix.sh $(PYTHON) $(MATRIX) -- $(PYTEST_ARGS)

# slurmgate as a user deploys it: its image (make image) on real Nodes (containerd + kubelet),
# `kubectl apply -k kustomize/overlays/local-incluster`, a marked Pod really running where Slurm
# placed it, leader handover between the binder Pods (tests/e2e/test_incluster.py,
# test_real_node.py; each module starts its own cluster); then the e2e suite against that
# deployment (SLURMGATE_E2E_DEPLOY=incluster; tests marked hostprocs skip there).
test-incluster: deps
	$(PYTHON) -m pytest -q -p no:cacheprovider -m incluster tests/e2e $(PYTEST_ARGS)
	SLURMGATE_E2E_DEPLOY=incluster $(PYTHON) -m pytest -q -p no:cacheprovider -rs --durations=15 \
	  --ignore=tests/e2e/test_bench_smoke.py tests/e2e \
	  $(PYTEST_ARGS)

# Re-record the real slurmrestd answers the unit tests replay (every release in $(MATRIX)).
record-fixtures: deps
	for v in $(MATRIX); do $(MAKE) --no-print-directory slurm-root SLURM_VERSION=$$v; done
	$(PYTHON) -m tests.fixtures.record_slurm_rest --versions $(shell echo $(MATRIX) | tr ' ' ,)

cluster-up: deps
	$(PYTHON) -m cluster.local up

cluster-down: venv
	$(PYTHON) -m cluster.bridge down
	$(PYTHON) -m cluster.local down

deploy: venv
	$(PYTHON) -m cluster.bridge up

undeploy: venv
	$(PYTHON) -m cluster.bridge down

# DEMO_ARGS=--in-cluster: slurmgate as Pods from its image on a real Node (kubectl apply -k)
DEMO_ARGS ?=
demo: deps
	$(PYTHON) -m cluster.demo $(DEMO_ARGS)

# The bench on every Slurm release in turn (each on a fresh cluster; the roots are built by the
# bench itself), bursts of 100 and 500 Pods. BENCH_ARGS='--scale' adds the 1,000-Pod burst,
# '--versions 26.05' runs one release, '--quick' a tiny run on $(SLURM_VERSION).
bench: deps
	$(PYTHON) -m pip install -q -e '.[dev,bench]'
	$(PYTHON) -m bench.run $(BENCH_ARGS)

# Chaos under load: churn Pods and gangs while every component is killed in turn, invariants
# checked twice a second (bench/chaos). Its own cluster (/tmp/slurmgate-chaos, ports +3000).
CHAOS_ARGS ?= --minutes 20
chaos: deps
	$(PYTHON) -m bench.chaos $(CHAOS_ARGS)

# The short variant CI runs: one round (every fault once, shorter quiet gaps) on each release in
# $(CHAOS_VERSIONS), one fresh cluster each (about 4 minutes a release). It fails on a violation
# and on a floor missed: too few Pods created or bound, or a fault never injected
# (bench/chaos/floor.py). The seed and the command that replays it are printed first.
CHAOS_VERSIONS ?= 26.05 24.11 22.05
CHAOS_RUN_DIR ?= /tmp/slurmgate-chaos
test-chaos: deps
	for v in $(CHAOS_VERSIONS); do $(MAKE) --no-print-directory slurm-root SLURM_VERSION=$$v; done
	$(PYTHON) -m bench.chaos --versions $(shell echo $(CHAOS_VERSIONS) | tr ' ' ,) --rounds 1 \
	  --gap 5 12 --minutes 10 --run-dir $(CHAOS_RUN_DIR)

clean: cluster-down
	rm -rf $(RUN_DIR) kustomize/overlays/*/generated

include mk/deploy.mk
include mk/image.mk
