# llama-server for the g5's NVIDIA A10G (sm_86) with CUDA, plus the launcher. Build on an x86-64 host; no GPU
# is needed to compile. The host needs an NVIDIA driver for CUDA 12 (>= 525; the Deep Learning Base AMI
# ships it) and the container toolkit (`docker run --gpus all`). The build context is the repository root.
ARG CUDA_VERSION=12.8.1
ARG BUILD_IMAGE=docker.io/nvidia/cuda:${CUDA_VERSION}-devel-ubuntu24.04
ARG RUNTIME_IMAGE=docker.io/nvidia/cuda:${CUDA_VERSION}-runtime-ubuntu24.04

FROM ${BUILD_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
# A10G is Ampere GA102: compute capability 8.6. Compiling one architecture keeps the build under ~25 min.
ARG CUDA_ARCHITECTURES=86
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
RUN python3 /usr/local/bin/fetch-llama-source --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
# GGML_NATIVE=OFF: the host code must not depend on the build machine's CPU (g5 runs AMD EPYC, AVX2).
# nvcc needs about 2.5 GB per job on the flash-attention kernels: jobs are capped by available memory.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" -DGGML_NATIVE=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
      -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined \
 && jobs=$(awk -v n="$(nproc)" '/^MemAvailable/ { j = int($2 / 2500000); print (j < 1 ? 1 : (j < n ? j : n)) }' /proc/meminfo) \
 && cmake --build build --target llama-server -j"${jobs}" \
 && install -D -m 0755 build/bin/llama-server /out/llama-server

FROM ${RUNTIME_IMAGE} AS runtime
ARG PIP_INDEX_URL=https://pypi.org/simple
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 llama \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --shell /usr/sbin/nologin llama \
 && install -d -o 10001 -g 10001 /models
# Runtime dependencies of modelfetch: the versions pinned in requirements.txt.
RUN python3 -m venv /opt/qwen36/venv \
 && /opt/qwen36/venv/bin/pip install --no-cache-dir --index-url "${PIP_INDEX_URL}" \
      urllib3==2.5.0 boto3==1.43.11 botocore==1.43.11
COPY --from=build /out/llama-server /usr/local/bin/llama-server
COPY catalog /opt/qwen36/catalog
COPY modelfetch /opt/qwen36/modelfetch
COPY launcher /opt/qwen36/launcher
COPY fleetmetrics /opt/qwen36/fleetmetrics
ENV PATH=/opt/qwen36/venv/bin:${PATH} PYTHONPATH=/opt/qwen36 PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /opt/qwen36
EXPOSE 8080
# A 17 GB model takes minutes to reach the GPU: /health answers 503 until then.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python3", "-m", "launcher", "health"]
ENTRYPOINT ["python3", "-m", "launcher"]
CMD ["serve"]
