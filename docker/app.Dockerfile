# The application layer, the same for every target: the runtime packages and their pure-Python dependencies
# on top of a llama.cpp base image (docker/<target>.Dockerfile). The image stage has no RUN: it builds for any
# architecture without emulation, and an application change rebuilds only these few megabytes. See docker/README.md.
ARG LLAMA_BASE=gguf-serve/llama-base
# A root of the builder's architecture with the image's Python (docker/build-image.sh passes the runtime root).
ARG CHECK_IMAGE=gguf-serve-root/runtime:amd64

FROM ${LLAMA_BASE} AS image
# Unpacked from the staged wheels (docker/requirements-image.txt) by docker/build-image.sh.
COPY site /opt/gguf-serve/site
COPY runtime /opt/gguf-serve/runtime
COPY modelfetch /opt/gguf-serve/modelfetch
COPY launcher /opt/gguf-serve/launcher
COPY fleetmetrics /opt/gguf-serve/fleetmetrics
COPY latencyproxy /opt/gguf-serve/latencyproxy
ENV PYTHONPATH=/opt/gguf-serve:/opt/gguf-serve/site PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /opt/gguf-serve
EXPOSE 8080
# A 22 GB model takes minutes to load: /health answers 503 until then.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python3", "-m", "launcher", "health"]
ENTRYPOINT ["python3", "-m", "launcher"]
CMD ["serve"]

# The build's last step (docker/build-image.sh builds this stage, then the image): every entry point imports,
# with the image's own Python where the builder can run it, and llama-server still resolves in the final root.
FROM ${CHECK_IMAGE} AS check
COPY --from=image / /check/
COPY docker/selfcheck.py /usr/local/bin/selfcheck
RUN python3 /usr/local/bin/selfcheck /check --no-elf --pythonpath /opt/gguf-serve:/opt/gguf-serve/site \
      --import launcher.cli --import modelfetch.cli --import fleetmetrics.cli --import latencyproxy.cli \
      --import boto3
