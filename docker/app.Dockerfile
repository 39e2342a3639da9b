# The application layer, the same for every target: the product's container code and its pure-Python dependencies
# on top of a llama.cpp base image (docker/<target>.Dockerfile). The image stage has no RUN: it builds for any
# architecture without emulation, and an application change rebuilds only these few megabytes. See docker/README.md.
ARG LLAMA_BASE=gguf-serve/llama-base
# A root of the builder's architecture with the image's Python (docker/build-image.sh passes the runtime root).
ARG CHECK_IMAGE=gguf-serve-root/runtime:amd64

FROM ${LLAMA_BASE} AS image
# Unpacked from the staged wheels (docker/requirements-image.txt) by docker/build-image.sh.
COPY site /opt/gguf-serve/site
# What the image runs: the product package's container folder, whole (stacks/image_inputs.py IMAGE_CODE).
COPY gguf_serve/__init__.py /opt/gguf-serve/gguf_serve/__init__.py
COPY gguf_serve/container /opt/gguf-serve/gguf_serve/container
ENV PYTHONPATH=/opt/gguf-serve:/opt/gguf-serve/site PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /opt/gguf-serve
EXPOSE 8080
# SageMaker may then pass another port in SAGEMAKER_BIND_TO_PORT (gguf_serve/container/sagemaker/contract.py).
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true
# A 22 GB model takes minutes to load: /health answers 503 until then.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python3", "-m", "gguf_serve.container.launch", "health"]
ENTRYPOINT ["python3", "-m", "gguf_serve.container.launch"]
CMD ["serve"]

# The build's last step (docker/build-image.sh builds this stage, then the image): every entry point imports,
# with the image's own Python where the builder can run it, and llama-server still resolves in the final root.
# First the bytecode the unconfigured runtime root lacks (Debian's postinst byte-compiles the standard library;
# bootstrap-base.sh never runs it): compiled by CHECK_IMAGE's Python, the same Debian Python 3.13 on the
# builder's architecture (bytecode is architecture-independent; refused if the versions differ). checked-hash:
# valid whatever mtimes COPY writes. Without it every start (the HEALTHCHECK every 15 s) compiled the standard
# library again: about 0.5 s natively, over a minute under QEMU.
FROM ${CHECK_IMAGE} AS check
COPY --from=image / /check/
COPY docker/selfcheck.py /usr/local/bin/selfcheck
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN py=$(python3 -c 'import sys; print("python%d.%d" % sys.version_info[:2])') \
 && if [ ! -x "/check/usr/bin/$py" ]; then echo "the image has no $py: CHECK_IMAGE must carry its Python"; exit 1; fi \
 && for dir in "/usr/lib/$py" /opt/gguf-serve; do \
      python3 -m compileall -q -j0 --invalidation-mode checked-hash -s "/check$dir" -p "$dir" "/check$dir" || exit 1; \
    done \
 && mkdir /bytecode \
 && find "/check/usr/lib/$py" /check/opt/gguf-serve -name '*.pyc' | sed 's|^/check/||' \
      | tar -C /check -cf - -T - | tar -xf - -C /bytecode \
 && find /bytecode -name 'argparse.cpython-*.pyc' | grep -q .
# libcuda.so.1 is the NVIDIA driver's, mounted by the container toolkit on a GPU host: never in an image (the
# CUDA base links it; the CPU bases do not, so allowing it changes nothing for them).
RUN python3 /usr/local/bin/selfcheck /check --no-elf --allow-missing libcuda.so.1 \
      --pythonpath /opt/gguf-serve:/opt/gguf-serve/site \
      --import gguf_serve.container.launch.cli --import gguf_serve.container.fetch.cli \
      --import gguf_serve.container.metrics.cli --import gguf_serve.container.hop.cli \
      --import gguf_serve.container.kube.cli \
      --import boto3
# The one compiled wheel, the hop's event loop, loads in the image's Python where the builder runs the image's
# machine (x86 here and in CodeBuild); an arm64 image built on x86 carries the aarch64 wheel build-image.sh chose.
RUN if chroot /check /usr/bin/true 2>/dev/null; then \
      chroot /check env PYTHONPATH=/opt/gguf-serve/site python3 -B -c 'import uvloop; print("imported", uvloop.__file__)'; \
    else echo "uvloop: built for the image's machine, not imported on this builder"; fi

# What runs: the image stage and the bytecode the check stage compiled (no RUN here either).
FROM image AS serving
COPY --from=check /bytecode/ /
