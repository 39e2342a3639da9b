"""Publish llama-server's Prometheus /metrics as CloudWatch custom metrics for scaling and alarms."""

from gguf_serve.container.metrics.derive import Datum, derive
from gguf_serve.container.metrics.prometheus import MetricFamily, Sample, parse_prometheus

__all__ = ["Datum", "MetricFamily", "Sample", "derive", "parse_prometheus"]
