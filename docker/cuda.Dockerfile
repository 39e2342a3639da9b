# The llama.cpp base for the g5's NVIDIA A10G (sm_86) with CUDA: llama-server on a bootstrapped runtime root.
# Both roots come from the same Debian mirror as the CPU images (docker/bootstrap-base.sh build-cuda and
# runtime-cuda): the build root carries Debian non-free's CUDA 12.4 toolkit (nvcc, with g++-13 as its host
# compiler), the runtime root only libcudart12, libcublas12 and libcublaslt12. No GPU is needed to build; the
# host needs an NVIDIA driver for CUDA 12.4 and the container toolkit (the Deep Learning Base AMI has both).
ARG BUILD_IMAGE=gguf-serve-root/build-cuda:amd64
ARG RUNTIME_IMAGE=gguf-serve-root/runtime-cuda:amd64

FROM ${BUILD_IMAGE} AS build
# Set only to fetch the source from a PEP 503 index (a mirror) when it was not staged.
ARG PIP_INDEX_URL=
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
# A10G is Ampere GA102: compute capability 8.6. Compiling one architecture keeps the build under ~25 min.
ARG CUDA_ARCHITECTURES=86
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
COPY sources/ /sources/
RUN python3 /usr/local/bin/fetch-llama-source --staged /sources --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
# GGML_NATIVE=OFF: the host code must not depend on the build machine's CPU (g5 runs AMD EPYC, AVX2).
# nvcc needs about 2.5 GB per job on the flash-attention kernels: jobs are capped by available memory.
# libcuda.so.1 is the driver's: linked against the toolkit's stub, provided by the host at run time.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" -DCMAKE_CUDA_HOST_COMPILER=g++-13 \
      -DGGML_NATIVE=OFF -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
      -DCMAKE_EXE_LINKER_FLAGS="-Wl,--allow-shlib-undefined" \
 && jobs=$(awk -v n="$(nproc)" '/^MemAvailable/ { j = int($2 / 2500000); print (j < 1 ? 1 : (j < n ? j : n)) }' /proc/meminfo) \
 && cmake --build build --target llama-server -j"${jobs}" \
 && install -D -m 0755 -s build/bin/llama-server /out/usr/local/bin/llama-server

FROM ${RUNTIME_IMAGE} AS root

# The last build step: llama-server in the runtime root finds every library but the driver's libcuda.so.1, runs
# (CUDA initialises lazily: --version needs no GPU) and prints the pinned build. The image gets only what passed.
FROM ${BUILD_IMAGE} AS check
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
COPY --from=root / /check/
COPY --from=build /out/ /check/
COPY --from=build /out/ /out/
COPY docker/selfcheck.py /usr/local/bin/selfcheck
# --version runs against the toolkit's libcuda stub (no driver here); the stub never reaches the image.
RUN stub=$(find /usr/lib -path '*stubs*' -name libcuda.so -print -quit) \
 && python3 /usr/local/bin/selfcheck /check --elf /usr/local/bin/llama-server --allow-missing libcuda.so.1 \
      --stub "libcuda.so.1=${stub:?no libcuda stub in the toolkit}" \
      --version-contains "(build ${LLAMA_CPP_BUILD}, commit ${LLAMA_CPP_COMMIT})"

FROM ${RUNTIME_IMAGE} AS runtime
ARG LLAMA_CPP_BUILD=11312
COPY --from=check /out/ /
# The NVIDIA container toolkit mounts the host driver's libcuda.so.1 when these are set.
ENV NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="llama.cpp b${LLAMA_CPP_BUILD} base, CUDA sm_86"
