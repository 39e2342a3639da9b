# The application layer, the same for every target: the runtime packages and their pure-Python dependencies
# on top of a llama.cpp base image (docker/<target>.Dockerfile). No RUN: it builds for any architecture
# without emulation, and an application change rebuilds only these few megabytes. See docker/README.md.
ARG LLAMA_BASE=qwen36/llama-base
FROM ${LLAMA_BASE}
# Unpacked from the staged wheels (docker/requirements-image.txt) by docker/build-image.sh.
COPY site /opt/qwen36/site
COPY catalog /opt/qwen36/catalog
COPY modelfetch /opt/qwen36/modelfetch
COPY launcher /opt/qwen36/launcher
COPY fleetmetrics /opt/qwen36/fleetmetrics
ENV PYTHONPATH=/opt/qwen36:/opt/qwen36/site PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /opt/qwen36
EXPOSE 8080
# A 22 GB model takes minutes to load: /health answers 503 until then.
HEALTHCHECK --interval=15s --timeout=5s --start-period=900s --retries=3 CMD ["python3", "-m", "launcher", "health"]
ENTRYPOINT ["python3", "-m", "launcher"]
CMD ["serve"]
