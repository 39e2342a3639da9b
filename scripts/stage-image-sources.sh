#!/usr/bin/env bash
# Stage what the in-region image build needs from outside the region, once, into a cache outside the checkout:
# the llama.cpp source (the pinned PyPI sdist, sha256-checked), the image's wheels (pip checks
# the hashes in docker/requirements-image.txt) and Debian's debootstrap package (docker/debian-sources.txt).
# Nothing is taken from this machine's own OS: any machine with Python, pip and curl stages the same bytes.
# `cdk synth` puts this directory into the build's S3 asset, so the builder reaches no package index.
# DEBIAN_MIRROR: where debootstrap is downloaded from (default deb.debian.org). Prints the directory on stdout.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
dockerfile="$root/docker/x86-64-cpu.Dockerfile"
version=$(sed -n 's/^ARG LLAMA_CPP_PYTHON_VERSION=//p' "$dockerfile")
sha256=$(sed -n 's/^ARG LLAMA_CPP_PYTHON_SHA256=//p' "$dockerfile")
cache_root="${LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gguf-serve}"
# One folder per set of pins (stacks/staged_sources.py computes the same key): two checkouts with different pins,
# or two branches, each find their own sources instead of re-staging over each other's.
key=$({ grep -E '^ARG LLAMA_CPP_PYTHON_(VERSION|SHA256)=' "$dockerfile"; cat "$root/docker/requirements-image.txt" \
  "$root/docker/debian-sources.txt"; } | sha256sum | cut -c1-12)
dest="$cache_root/image-sources/$key"
python="${PYTHON:-python3}"
sdist="$dest/llama_cpp_python-$version.tar.gz"

mkdir -p "$dest/wheels"
# One stager at a time (a test tier and `make image-sources` may run at once); each file below is downloaded to a
# temporary name and moved into place, so a reader never sees half of one.
exec 9>"$cache_root/.image-sources.lock"
flock 9
if ! echo "$sha256  $sdist" | sha256sum -c --quiet - >/dev/null 2>&1; then
  work="$(mktemp -d "${TMPDIR:-/tmp}/stage.XXXXXX")"
  trap 'rm -rf "$work"' EXIT
  "$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "llama-cpp-python==$version" >&2
  echo "$sha256  $work/llama_cpp_python-$version.tar.gz" | sha256sum -c --quiet - >&2 \
    || { echo "sha256 of llama_cpp_python-$version.tar.gz is not $sha256" >&2; exit 1; }
  find "$dest" -maxdepth 1 -name 'llama_cpp_python-*.tar.gz' -delete
  cp "$work/llama_cpp_python-$version.tar.gz" "$sdist.part" # /tmp may be another file system: no mv across it
  mv "$sdist.part" "$sdist"
fi

want=$(grep -o -- '--hash=sha256:[0-9a-f]\{64\}' "$root/docker/requirements-image.txt" | cut -d: -f2 | sort)
# An empty or partial folder (a fresh cache) must lead to the download below, not end the script under set -e.
have=$(cd "$dest/wheels" && { sha256sum -- *.whl 2>/dev/null || true; } | cut -d' ' -f1 | sort)
if [[ "$want" != "$have" || ! -f "$dest/wheels/SHA256SUMS" ]]; then
  rm -rf "$dest/wheels.tmp"
  mkdir -p "$dest/wheels.tmp"
  # For the images' Python (Debian trixie's CPython 3.13), once per architecture: pure-Python wheels are the same
  # files both times, uvloop's binary wheel one per architecture; whatever Python and OS this machine has.
  for platform in manylinux_2_28_x86_64 manylinux_2_28_aarch64; do
    "$python" -m pip download --quiet --no-deps --only-binary :all: --require-hashes \
      --platform "$platform" --python-version 3.13 --implementation cp --abi cp313 \
      -r "$root/docker/requirements-image.txt" --dest "$dest/wheels.tmp" >&2
  done
  (cd "$dest/wheels.tmp" && sha256sum -- *.whl >SHA256SUMS)
  rm -rf "$dest/wheels"
  mv "$dest/wheels.tmp" "$dest/wheels"
fi

# debootstrap, architecture all, checked against its pinned sha256 (Python's hashlib: macOS has no sha256sum).
sha256_of() { "$python" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' "$1"; }
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
read -r deb_path deb_sha256 < <(grep -v '^#' "$root/docker/debian-sources.txt")
deb="$dest/debian/${deb_path##*/}"
if [[ ! -f "$deb" || "$(sha256_of "$deb")" != "$deb_sha256" ]]; then
  rm -rf "$dest/debian"
  mkdir -p "$dest/debian"
  curl -fsSL --retry 3 -o "$deb.part" "$mirror/$deb_path" \
    || { echo "cannot download $mirror/$deb_path; set DEBIAN_MIRROR to a Debian mirror you reach" >&2; exit 1; }
  [[ "$(sha256_of "$deb.part")" == "$deb_sha256" ]] \
    || { echo "sha256 of $mirror/$deb_path is not $deb_sha256" >&2; rm -f "$deb.part"; exit 1; }
  mv "$deb.part" "$deb"
fi
rm -rf "$dest/qemu" # staged by earlier versions: the arm64 image is cross-compiled now
echo "$dest"
