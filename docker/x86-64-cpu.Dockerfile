# llama-server for Intel c8i (Xeon with AVX-512 and AMX), CPU only, plus the launcher. Build on an x86-64
# host (CodeBuild LINUX_CONTAINER); the build context is the repository root. See docker/README.md.
ARG BASE_IMAGE=docker.io/library/ubuntu:24.04

FROM ${BASE_IMAGE} AS build
ARG PIP_INDEX_URL=https://pypi.org/simple
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake python3 ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
RUN python3 /usr/local/bin/fetch-llama-source --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
# One CPU backend per x86 generation (14, from x64 to sapphirerapids; all are dependencies of ggml), chosen
# at start from what the CPU reports: c8i gets sapphirerapids (AVX-512 VNNI/BF16, AMX-INT8), and the image
# still runs on any other x86 instance type.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DBUILD_SHARED_LIBS=ON \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
 && cmake --build build --target llama-server -j"$(nproc)" \
 && install -d /out \
 && cp -P build/bin/llama-server build/bin/*.so* /out/

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
# llama-server finds the CPU variants next to its real path; the loader finds its libraries via ld.so.conf.
COPY --from=build /out/ /opt/llama.cpp/
RUN ln -s /opt/llama.cpp/llama-server /usr/local/bin/llama-server \
 && echo /opt/llama.cpp > /etc/ld.so.conf.d/llama-cpp.conf \
 && ldconfig
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
