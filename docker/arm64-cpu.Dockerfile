# The llama.cpp base for Graviton4 (c8g, Neoverse V2), CPU only: llama-server on a bootstrapped runtime root.
# No package manager and no network here: BUILD_IMAGE and RUNTIME_IMAGE are root filesystems
# docker/bootstrap-base.sh made from a Debian mirror, and the llama.cpp source is staged in sources/.
# Cross-compiled: BUILD_IMAGE is the builder's own architecture (x86 CodeBuild: Debian's g++-aarch64-linux-gnu;
# an arm64 builder: its native gcc, which answers to the same aarch64-linux-gnu- names), and no step runs arm64
# code, so no emulator is needed. docker/build-image.sh builds it, then docker/app.Dockerfile.
ARG BUILD_IMAGE=gguf-serve-root/build:arm64
ARG RUNTIME_IMAGE=gguf-serve-root/runtime:arm64

FROM ${BUILD_IMAGE} AS build
# Set only to fetch the source from a PEP 503 index (a mirror) when it was not staged.
ARG PIP_INDEX_URL=
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
# Neoverse V2 is Armv9.0-A (SVE2) with Int8 matrix multiply, BF16 and FP16 arithmetic; GCC 14 knows both names.
ARG GGML_CPU_ARM_ARCH=armv9-a+i8mm+bf16+fp16
ARG CPU_TUNE=neoverse-v2
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
COPY sources/ /sources/
RUN python3 /usr/local/bin/fetch-llama-source --staged /sources --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_SYSTEM_NAME=Linux -DCMAKE_SYSTEM_PROCESSOR=aarch64 \
      -DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc -DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++ \
      -DGGML_NATIVE=OFF -DGGML_CPU_ARM_ARCH="${GGML_CPU_ARM_ARCH}" \
      -DCMAKE_C_FLAGS="-mtune=${CPU_TUNE}" -DCMAKE_CXX_FLAGS="-mtune=${CPU_TUNE}" \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
 && cmake --build build --target llama-server -j"$(nproc)" \
 && install -D -m 0755 build/bin/llama-server /out/usr/local/bin/llama-server \
 && aarch64-linux-gnu-strip --strip-unneeded /out/usr/local/bin/llama-server

FROM ${RUNTIME_IMAGE} AS root

# The last build step: llama-server in the runtime root finds every library (docker/selfcheck.py, from the
# build root); it also runs it where the builder can run arm64 code (the image tier under QEMU). The image gets
# only the files that passed.
FROM ${BUILD_IMAGE} AS check
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
COPY --from=root / /check/
COPY --from=build /out/ /check/
COPY --from=build /out/ /out/
COPY docker/selfcheck.py /usr/local/bin/selfcheck
RUN python3 /usr/local/bin/selfcheck /check --elf /usr/local/bin/llama-server \
      --version-contains "(build ${LLAMA_CPP_BUILD}, commit ${LLAMA_CPP_COMMIT})"

FROM ${RUNTIME_IMAGE} AS runtime
ARG LLAMA_CPP_BUILD=11312
COPY --from=check /out/ /
LABEL org.opencontainers.image.title="llama.cpp b${LLAMA_CPP_BUILD} base, arm64 CPU (Neoverse V2)"
