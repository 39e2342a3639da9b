# The llama.cpp base for the g5's NVIDIA A10G (sm_86) with CUDA. Compiled in BUILD_IMAGE, which must carry
# nvcc: by default an AWS Deep Learning Container from the region's own registry (the stack passes it; see
# catalog/images.py). The runtime is the bootstrapped root plus the three CUDA libraries llama-server links,
# copied from the build image, not a multi-gigabyte CUDA runtime image. No GPU is needed to build; the host
# needs an NVIDIA driver for CUDA 12 and the container toolkit (the Deep Learning Base AMI has both).
ARG BUILD_IMAGE
ARG RUNTIME_IMAGE=gguf-serve-root/runtime:amd64

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
# libstdc++ and libgcc are linked statically: the runtime root's may be older than the build image's.
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCHITECTURES}" -DGGML_NATIVE=OFF \
      -DBUILD_SHARED_LIBS=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
      -DCMAKE_EXE_LINKER_FLAGS="-Wl,--allow-shlib-undefined -static-libstdc++ -static-libgcc" \
 && jobs=$(awk -v n="$(nproc)" '/^MemAvailable/ { j = int($2 / 2500000); print (j < 1 ? 1 : (j < n ? j : n)) }' /proc/meminfo) \
 && cmake --build build --target llama-server -j"${jobs}" \
 && install -D -m 0755 -s build/bin/llama-server /out/usr/local/bin/llama-server \
 && install -d /out/usr/local/lib/cuda \
 && cp -L "$(dirname "$(readlink -f "$(command -v nvcc)")")"/../lib64/libcudart.so.12 \
      "$(dirname "$(readlink -f "$(command -v nvcc)")")"/../lib64/libcublas.so.12 \
      "$(dirname "$(readlink -f "$(command -v nvcc)")")"/../lib64/libcublasLt.so.12 /out/usr/local/lib/cuda/

FROM ${RUNTIME_IMAGE} AS runtime
ARG LLAMA_CPP_BUILD=11312
COPY --from=build /out/usr/ /usr/
# libcuda.so.1 comes from the host's driver through the NVIDIA container toolkit at run time.
ENV LD_LIBRARY_PATH=/usr/local/lib/cuda NVIDIA_VISIBLE_DEVICES=all NVIDIA_DRIVER_CAPABILITIES=compute,utility
LABEL org.opencontainers.image.title="llama.cpp b${LLAMA_CPP_BUILD} base, CUDA sm_86"
