#!/usr/bin/env bash
# Build a real llama-server from the llama.cpp tree vendored in a pinned PyPI sdist, once, into a cache
# outside the checkout. Prints the binary's path on stdout. Re-runs reuse the cached binary.
# LLAMA_SERVER_CONFIGURE_ONLY=1: download, verify and configure, then print the cache entry instead of compiling.
set -euo pipefail

version="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
sha256="${LLAMA_CPP_PYTHON_SHA256:-832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e}"
cache_root="${LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gguf-serve}"
python="${PYTHON:-python3}"
root="$(cd "$(dirname "$0")/.." && pwd)"
# A native build is built for this CPU: its flags, minus AMX where cpuid promises AMX that a probe cannot
# execute (gguf_serve/container/launch/cpu.py). The cache key covers the CPU's flags, the probe's result, the compiler and the
# configure flags, so a cache carried to another CPU is rebuilt, never run into SIGILL or SIGSEGV.
cmake_flags=(-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DBUILD_SHARED_LIBS=OFF)
why=$(mktemp)
cflags=$("$python" "$root/gguf_serve/container/launch/cpu.py" build-flags 2>"$why")
cpu_line=$(tail -n 1 "$why")
rm -f "$why"
compiler=$(c++ --version 2>/dev/null | head -n 1 || echo none)
tag=$("$python" "$root/gguf_serve/container/launch/cpu.py" cache-tag "$sha256 ${cmake_flags[*]} $cflags $compiler")
dest="$cache_root/llama-server-$version-$(uname -m)-$tag"
binary="$dest/bin/llama-server"

cached() { [[ -x "$binary" ]] && "$binary" --version >/dev/null 2>&1; }
if cached; then
  echo "$binary"
  exit 0
fi
# One build at a time per cache (tests, `make demo` and a second shell may ask at once); the winner's binary
# serves the others.
mkdir -p "$cache_root"
exec 9>"$cache_root/.llama-server.lock"
flock 9
if cached; then
  echo "$binary"
  exit 0
fi

work="$(mktemp -d "${TMPDIR:-/tmp}/llama-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# One line per stage on stderr; every tool's own output goes to one log, named when a stage fails.
log="$cache_root/llama-server-build.log"
: >"$log"
stage() { echo "llama-server build: $1" >&2; }
failed() {
  echo "llama-server build: $1 failed; the last lines of $log:" >&2
  tail -n 25 "$log" >&2
  exit 1
}
stage "building from llama-cpp-python==$version (first run only, 5-10 min on 2 cores; output in $log)"
stage "$cpu_line"
sdist="$work/llama_cpp_python-$version.tar.gz"
staged=$(compgen -G "$cache_root/image-sources/*/llama_cpp_python-$version.tar.gz" | head -n 1 || true)
if [[ -n "$staged" ]] && echo "$sha256  $staged" | sha256sum -c --quiet - >/dev/null 2>&1; then
  cp "$staged" "$sdist" # `make image-sources` has it already
else
  stage "downloading the sdist"
  "$python" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" "llama-cpp-python==$version" >>"$log" 2>&1 ||
    failed "the sdist download"
fi
echo "$sha256  $sdist" | sha256sum -c --quiet - >>"$log" 2>&1 || { echo "sha256 of $sdist is not $sha256" >&2; exit 1; }
tar -xzf "$sdist" -C "$work"
src="$work/llama_cpp_python-$version/vendor/llama.cpp"
stage "configuring"
cmake -S "$src" -B "$work/build" "${cmake_flags[@]}" -DCMAKE_C_FLAGS="$cflags" -DCMAKE_CXX_FLAGS="$cflags" >>"$log" 2>&1 ||
  failed "configure"
if [[ "${LLAMA_SERVER_CONFIGURE_ONLY:-}" == 1 ]]; then # the fresh-cache test tier: every step but the compile
  echo "$dest"
  exit 0
fi
stage "compiling ($(nproc) jobs)"
cmake --build "$work/build" --target llama-server -j "$(nproc)" >>"$log" 2>&1 || failed "the compile"
rm -rf "$dest.tmp"
mkdir -p "$dest.tmp/bin"
cp "$work/build/bin/llama-server" "$dest.tmp/bin/"
printf 'llama-cpp-python %s (sha256 %s)\ncmake %s\ncflags %s\ncompiler %s\n' \
  "$version" "$sha256" "${cmake_flags[*]}" "$cflags" "$compiler" >"$dest.tmp/BUILD-INFO"
rm -rf "$dest"
mv "$dest.tmp" "$dest"
stage "done: $("$binary" --version 2>&1 | head -n 1)"
echo "$binary"
