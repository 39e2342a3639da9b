# The llama.cpp base for Intel c8i (Xeon with AVX-512 and AMX), CPU only: llama-server on a bootstrapped
# runtime root. No package manager and no network here: BUILD_IMAGE and RUNTIME_IMAGE are root filesystems
# docker/bootstrap-base.sh made from OS repositories, and the llama.cpp source is staged in sources/.
# docker/build-image.sh builds it, then docker/app.Dockerfile on top. See docker/README.md.
ARG BUILD_IMAGE=gguf-serve-root/build:amd64
ARG RUNTIME_IMAGE=gguf-serve-root/runtime:amd64

FROM ${BUILD_IMAGE} AS build
# Set only to fetch the source from a PEP 503 index (a mirror) when it was not staged.
ARG PIP_INDEX_URL=
# llama.cpp source: the tree vendored in this PyPI sdist (llama.cpp commit 0c1e57098, build b11312).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG LLAMA_CPP_PYTHON_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
COPY docker/fetch-llama-source.py /usr/local/bin/fetch-llama-source
COPY sources/ /sources/
RUN python3 /usr/local/bin/fetch-llama-source --staged /sources --index-url "${PIP_INDEX_URL}" \
      --version "${LLAMA_CPP_PYTHON_VERSION}" --sha256 "${LLAMA_CPP_PYTHON_SHA256}" --dest /src/llama.cpp
WORKDIR /src/llama.cpp
# One CPU backend per x86 generation (14, from x64 to sapphirerapids; all are dependencies of ggml), chosen
# at start from what the CPU reports: c8i gets sapphirerapids (AVX-512 VNNI/BF16, AMX-INT8), and the image
# still runs on any other x86 instance type. RPATH $ORIGIN: the libraries sit next to the binary.
# hadolint ignore=SC2016
RUN cmake -S . -B build -DCMAKE_BUILD_TYPE=Release \
      -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON -DBUILD_SHARED_LIBS=ON \
      -DCMAKE_BUILD_WITH_INSTALL_RPATH=ON -DCMAKE_INSTALL_RPATH='$ORIGIN' \
      -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
      -DLLAMA_OPENSSL=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
      -DLLAMA_BUILD_NUMBER="${LLAMA_CPP_BUILD}" -DLLAMA_BUILD_COMMIT="${LLAMA_CPP_COMMIT}" \
 && cmake --build build --target llama-server -j"$(nproc)" \
 && install -d /out/opt/llama.cpp /out/usr/local/bin \
 && cp -P build/bin/llama-server build/bin/*.so* /out/opt/llama.cpp/ \
 && find /out/opt/llama.cpp -type f -exec strip --strip-unneeded {} + \
 && ln -s /opt/llama.cpp/llama-server /out/usr/local/bin/llama-server

FROM ${RUNTIME_IMAGE} AS root

# The last build step: llama-server in the runtime root finds every library, runs and prints the pinned build,
# checked from the build root (docker/selfcheck.py). The image gets only the files that passed.
FROM ${BUILD_IMAGE} AS check
ARG LLAMA_CPP_BUILD=11312
ARG LLAMA_CPP_COMMIT=0c1e57098
COPY --from=root / /check/
COPY --from=build /out/ /check/
COPY --from=build /out/ /out/
COPY docker/selfcheck.py /usr/local/bin/selfcheck
RUN python3 /usr/local/bin/selfcheck /check --elf /usr/local/bin/llama-server --elf "/opt/llama.cpp/*.so" \
      --version-contains "(build ${LLAMA_CPP_BUILD}, commit ${LLAMA_CPP_COMMIT})"

FROM ${RUNTIME_IMAGE} AS runtime
ARG LLAMA_CPP_BUILD=11312
# llama-server finds the CPU variants next to its real path, and its libraries through RPATH.
COPY --from=check /out/ /
LABEL org.opencontainers.image.title="llama.cpp b${LLAMA_CPP_BUILD} base, x86-64 CPU"
