"""The container's metrics for CloudWatch, written to its own log in the embedded metric format (EMF).

With network isolation the container can call nothing, CloudWatch included. SageMaker ships the container's
stdout to CloudWatch Logs (/aws/sagemaker/Endpoints/<endpoint>), and CloudWatch Logs turns each EMF line into
metrics: no API call, no credentials, no network. The values are the EC2 stacks' (gguf_serve/container/metrics):
llama-server's slot gauges and token rates from its /metrics, the hop's histograms as distributions (so CloudWatch
computes p50/p95/p99 across the variant), and the drain's counts, under the same namespace, with the dimensions
EndpointName and VariantName instead of the Auto Scaling group.

Sources: "Specification: Embedded metric format", CloudWatch User Guide,
https://docs.amazonaws.cn/en_us/AmazonCloudWatch/latest/monitoring/CloudWatch_Embedded_Metric_Format_Specification.html
(one JSON object per log event, at most 100 metrics per directive, events up to 256 KB). A distribution is written
as aws-embedded-metrics-java's HistogramMetric writes it ({"Values", "Counts", "Max", "Min", "Count", "Sum"}, at
most 100 values): each in a line of its own, so that a region whose CloudWatch Logs refuses that form loses only
the distribution, never the slot gauges scaling and alarms read.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gguf_serve.container.hop.drain import DrainState
from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.derive import COUNT, Datum, derive
from gguf_serve.container.metrics.prometheus import parse_prometheus
from gguf_serve.container.metrics.publish import latency_datums
from gguf_serve.container.metrics.scrape import ScrapeError, scrape_metrics

log = logging.getLogger("gguf-serve-sagemaker")

DIM_ENDPOINT = "EndpointName"
DIM_VARIANT = "VariantName"
INTERVAL_S = 60  # CloudWatch's standard resolution; ConcurrentRequestsPerModel (SageMaker's own) scales faster
MAX_VALUES = 100
# A write of at most PIPE_BUF bytes to a pipe is never interleaved with another (POSIX), so llama-server's output
# on the same stdout cannot split an EMF line; a longer line is written anyway (the log may then split it).
PIPE_BUF = 4096


def emf_lines(datums: list[Datum], *, dimensions: dict[str, str], timestamp_ms: int, host: str) -> list[str]:
    """One line for the plain values, and one per distribution."""
    plain = [d for d in datums if not d.values]
    groups = ([plain] if plain else []) + [[d] for d in datums if d.values]
    return [_record(group, dimensions, timestamp_ms, host) for group in groups]


def _record(datums: list[Datum], dimensions: dict[str, str], timestamp_ms: int, host: str) -> str:
    directive = {
        "Namespace": names.NAMESPACE,
        "Dimensions": [list(dimensions)],
        "Metrics": [{"Name": d.name, "Unit": d.unit} for d in datums],
    }
    doc: dict[str, Any] = {"_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": [directive]}, **dimensions}
    doc["host"] = host  # a property, not a dimension: which instance wrote it, without a metric per instance
    for d in datums:
        doc[d.name] = _value(d)
    return json.dumps(doc, separators=(",", ":"))


def _value(d: Datum) -> Any:
    if not d.values:
        return d.value
    values, counts = list(d.values[:MAX_VALUES]), list(d.counts[:MAX_VALUES])
    return {
        "Values": values,
        "Counts": counts,
        "Max": max(values),
        "Min": min(values),
        "Count": sum(counts),
        "Sum": sum(v * c for v, c in zip(values, counts, strict=True)),
    }


def drain_datums(drain: DrainState) -> list[Datum]:
    return [
        Datum(names.DRAINS, 1, COUNT),
        Datum(names.DRAIN_STREAMS_FINISHED, drain.finished, COUNT),
        Datum(names.DRAIN_STREAMS_CUT, drain.cut or 0, COUNT),
        Datum(names.DRAIN_REFUSED, drain.refused, COUNT),
        Datum(names.DRAIN_SECONDS, (drain.ended or time.time()) - drain.started, "Seconds"),
    ]


class EmfEmitter:
    """Every INTERVAL_S: llama-server's /metrics and the front's own families, derived as the EC2 publisher does."""

    def __init__(
        self,
        *,
        upstream_url: str,
        hop_exposition: Callable[[], str],
        slots: int,
        dimensions: dict[str, str],
        fd: int = 1,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.upstream_url = upstream_url
        self.hop_exposition = hop_exposition
        self.slots = slots
        self.dimensions = dimensions
        self.fd = fd
        self.clock = clock
        self.host = socket.gethostname()
        self._prev: dict[str, Any] | None = None
        self._prev_at = 0.0
        self._start_time: str | None = None
        self._lock = threading.Lock()

    def step(self) -> list[Datum]:
        at = self.clock()
        try:
            scrape = scrape_metrics(self.upstream_url, None, timeout=10.0)
        except ScrapeError as e:
            log.warning("metrics: %s", e)
            datums = [Datum(names.SCRAPE_FAILED, 1.0, COUNT)]
        else:
            families = {**scrape.families, **parse_prometheus(self.hop_exposition())}
            restarted = self._prev is not None and scrape.start_time != self._start_time
            datums = derive(self._prev, families, at - self._prev_at, slots=self.slots, restarted=restarted)
            datums += latency_datums(self._prev, families)
            datums.append(Datum(names.SCRAPE_FAILED, 0.0, COUNT))
            self._prev, self._prev_at, self._start_time = families, at, scrape.start_time
        self.write(datums)
        return datums

    def write(self, datums: list[Datum]) -> None:
        lines = emf_lines(datums, dimensions=self.dimensions, timestamp_ms=int(time.time() * 1000), host=self.host)
        with self._lock:
            for line in lines:
                data = (line + "\n").encode()
                if len(data) > PIPE_BUF:
                    log.warning("metrics: a %d-byte EMF line; the log may split it", len(data))
                os.write(self.fd, data)

    def run(self, stop: threading.Event, interval: float = INTERVAL_S) -> None:
        next_at = self.clock() + interval
        while not stop.wait(max(0.0, next_at - self.clock())):
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - one bad cycle is a log line; the next one runs
                log.warning("metrics cycle failed: %s: %s", type(e).__name__, e)
            next_at += interval
