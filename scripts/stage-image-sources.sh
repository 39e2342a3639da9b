#!/usr/bin/env bash
# Stage what the in-region image build needs from outside the region, once, into a cache outside the checkout:
# the llama.cpp source (the pinned PyPI sdist, sha256-checked) and the image's pure-Python wheels (pip checks
# the hashes in docker/requirements-image.txt), and this machine's qemu-aarch64-static when it has one.
# `cdk synth` puts this directory into the build's S3 asset, so the builder reaches no package index.
# Prints the directory on stdout.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dockerfile="$root/docker/x86-64-cpu.Dockerfile"
version=$(sed -n 's/^ARG LLAMA_CPP_PYTHON_VERSION=//p' "$dockerfile")
sha256=$(sed -n 's/^ARG LLAMA_CPP_PYTHON_SHA256=//p' "$dockerfile")
cache_root="${LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gguf-serve}"
dest="$cache_root/image-sources"
python="${PYTHON:-python3}"
sdist="$dest/llama_cpp_python-$version.tar.gz"

mkdir -p "$dest/wheels"
if ! echo "$sha256  $sdist" | sha256sum -c --quiet - >/dev/null 2>&1; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/stage.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "llama-cpp-python==$version" >&2
  echo "$sha256  $work/llama_cpp_python-$version.tar.gz" | sha256sum -c --quiet - >&2 \
    || { echo "sha256 of llama_cpp_python-$version.tar.gz is not $sha256" >&2; exit 1; }
  find "$dest" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' -delete
  mv "$work/llama_cpp_python-$version.tar.gz" "$sdist"
fi

want=$(sed -n 's/.*--hash=sha256:\([0-9a-f]\{64\}\).*/\1/p' "$root/docker/requirements-image.txt" | sort)
# An empty or partial folder (a fresh cache) must lead to the download below, not end the script under set -e.
have=$(cd "$dest/wheels" && { sha256sum -- *.whl 2>/dev/null || true; } | cut -d' ' -f1 | sort)
if [[ "$want" != "$have" ]]; then
  rm -f "$dest"/wheels/*.whl "$dest/wheels/SHA256SUMS"
  "$python" -m pip download --quiet --no-deps --only-binary :all: --require-hashes \
    -r "$root/docker/requirements-image.txt" --dest "$dest/wheels" >&2
  (cd "$dest/wheels" && sha256sum -- *.whl >SHA256SUMS)
fi

# The arm64 image is built on the x86 builder under QEMU where CodeBuild offers no arm64 builder: stage this
# machine's static user-mode emulator (Debian/Ubuntu: qemu-user-static). Without it only x86 images build.
if qemu=$(command -v qemu-aarch64-static); then
  cmp -s "$qemu" "$dest/qemu/qemu-aarch64-static" || install -D -m 0755 "$qemu" "$dest/qemu/qemu-aarch64-static"
else
  rm -rf "$dest/qemu"
  echo "note: no qemu-aarch64-static here; the arm64 image then needs CodeBuild's native arm64 builder" >&2
fi
echo "$dest"
