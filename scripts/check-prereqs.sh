#!/usr/bin/env bash
# The README's prerequisites, checked in the first second of `make demo` and `make test`: one line per
# missing one, naming the Debian package, then exit 1. Everything else the commands install themselves
# (the venvs, the CDK CLI, llama-server, the staged image sources; as root, the tiers' Docker engine,
# debootstrap and Prometheus).
#   check-prereqs.sh PYTHON
set -euo pipefail

python="${1:-python3.11}"
missing=()
need() { # command, what to install
  command -v "$1" >/dev/null 2>&1 || missing+=("$1 (Debian: apt-get install $2)")
}
if ! "$python" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info[:2] != (3, 11))' >/dev/null 2>&1; then
  missing+=("$python: Python 3.11 with venv and ensurepip (Debian 12: apt-get install python3.11 python3.11-venv; or PYTHON=/path/to/python3.11)")
fi
need node nodejs
need npm npm
if command -v node >/dev/null 2>&1; then
  major=$(node -p 'process.versions.node.split(".")[0]' 2>/dev/null || echo 0)
  ((major >= 20)) || missing+=("node $major: Node.js 20 or newer (the CDK CLI 2.1148.1 needs it)")
fi
need cmake cmake
need c++ build-essential
need cc build-essential
need make build-essential
need tar tar
need curl curl # make image-sources: debootstrap from the Debian mirror
need sha256sum coreutils

if ((${#missing[@]})); then
  for m in "${missing[@]}"; do echo "missing prerequisite: $m" >&2; done
  exit 1
fi
