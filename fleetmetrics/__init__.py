"""Publish llama-server's Prometheus /metrics as CloudWatch custom metrics for scaling and alarms."""

from fleetmetrics.derive import Datum, derive
from fleetmetrics.prometheus import MetricFamily, Sample, parse_prometheus

__all__ = ["Datum", "MetricFamily", "Sample", "derive", "parse_prometheus"]
