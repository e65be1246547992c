#!/usr/bin/env bash
# The Debian packages the test suite's real validators and tiers use (.ci/apt-packages.txt: cloud-init,
# the shell linter, systemd, Prometheus and promtool, QEMU, debootstrap, ...), installed when missing.
#
#   bash scripts/dev/system_packages.sh          # what `make system-packages` and `make test` run
#
# Nothing missing: silent, exit 0. Missing and root (or passwordless sudo): apt-get installs them.
# Missing otherwise: one line naming them and the command to run (`sudo make system-packages`), exit 2.
# Not a Debian-family system (no dpkg): one line saying what to install instead, exit 0 (the tests
# that need a tool skip, or fail under CI=true).
set -euo pipefail
cd "$(dirname "$0")/../.."
LIST=.ci/apt-packages.txt

if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
  sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
  exit 0
fi
if [ "$#" -gt 0 ]; then
  echo "system_packages: usage error: no arguments are taken (see --help)" >&2
  exit 2
fi
if ! command -v dpkg >/dev/null 2>&1; then
  echo "system_packages: not a Debian-family system (no dpkg): install the equivalents of $LIST yourself" >&2
  exit 0
fi
missing=()
while read -r pkg; do
  case "$pkg" in ""|"#"*) continue ;; esac
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done < "$LIST"
[ "${#missing[@]}" -eq 0 ] && exit 0
if [ "$(id -u)" -eq 0 ]; then
  as_root=()
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
  as_root=(sudo)
else
  echo "system_packages: missing Debian packages: ${missing[*]} (the real-validator, Prometheus and VM tests use them); run: sudo make system-packages" >&2
  exit 2
fi
echo "system_packages: installing ${missing[*]} (apt-get, first run only)" >&2
export DEBIAN_FRONTEND=noninteractive
"${as_root[@]}" apt-get update -qq >/dev/null
"${as_root[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "system_packages: installed ${#missing[@]} package(s)" >&2
