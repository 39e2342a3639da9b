# llama-server for Graviton4 (c8g, Neoverse V2), CPU only, plus the launcher. Build on a native arm64 host
# (CodeBuild ARM_CONTAINER); the build context is the repository root. See docker/README.md.
ARG BASE_IMAGE=docker.io/library/ubuntu:24.04

FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
# Neoverse V2 is Armv9.0-A with SVE2, Int8 matrix multiply, BF16 and FP16 arithmetic.
ARG GGML_CPU_ARM_ARCH=armv9-a+i8mm+bf16+fp16
ARG CPU_TUNE=neoverse-v2
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
RUN python3 /usr/local/bin/fetch-llama-source --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="${GGML_CPU_ARM_ARCH}" \
      -DCMAKE_C_FLAGS="-mtune=${CPU_TUNE}" -DCMAKE_CXX_FLAGS="-mtune=${CPU_TUNE}" \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
 && cmake --build build --target llama-server -j"$(nproc)" \
 && install -D -m 0755 build/bin/llama-server /out/llama-server

FROM ${BASE_IMAGE} AS runtime
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
# A 22 GB model takes minutes to load: /health answers 503 until then.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python3", "-m", "launcher", "health"]
ENTRYPOINT ["python3", "-m", "launcher"]
CMD ["serve"]
