"""The hop's histograms become CloudWatch distributions (Values/Counts) that PutMetricData accepts."""

from __future__ import annotations

from datetime import UTC, datetime

import boto3
import pytest
from botocore.stub import Stubber

from gguf_serve.container.hop import names as hop
from gguf_serve.container.hop.metrics import RequestMetrics, RequestRecord
from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.latency import distributions
from gguf_serve.container.metrics.prometheus import parse_prometheus
from gguf_serve.container.metrics.publish import latency_datums, metric_data


def _observe(m: RequestMetrics, ttft: float, *, tps: float = 20.0, drafted: int = 0, accepted: int = 0) -> None:
    r = RequestRecord(started=0.0, stream=True, status=200, finished=ttft + 1.0)
    r.token(ttft)
    r.token(ttft + 0.04)
    r.timings = {"prompt_ms": 1, "predicted_ms": 1, "predicted_n": 2, "predicted_per_second": tps,
                 "draft_n": drafted, "draft_n_accepted": accepted}  # fmt: skip
    m.observe(r)


def _scrape(m: RequestMetrics):
    return parse_prometheus(m.exposition())


def test_interval_increase_becomes_bucket_midpoints_with_counts() -> None:
    m = RequestMetrics()
    _observe(m, 0.3)
    before = _scrape(m)
    for ttft in (0.3, 0.4, 0.7, 3.0):  # buckets (0.25, 0.5], (0.25, 0.5], (0.5, 1], (2, 4]
        _observe(m, ttft, drafted=4, accepted=3)
    out = {d.name: d for d in distributions(before, _scrape(m))}
    ttft = out[names.TTFT]
    assert ttft.unit == "Seconds"
    assert list(zip(ttft.values, ttft.counts, strict=True)) == [(0.375, 2), (0.75, 1), (3.0, 1)]
    assert out[names.INTER_TOKEN_LATENCY].counts == [4]  # one gap per request, the first request excluded
    assert out[names.REQUEST_DRAFT_ACCEPTANCE].unit == "Percent"
    assert out[names.REQUEST_DRAFT_ACCEPTANCE].values == [pytest.approx(75.0)]  # 3/4 in (0.7, 0.8]: midpoint
    assert out[names.DECODE_TPS].values == [17.5] and out[names.DECODE_TPS].counts == [4]


def test_overflow_bucket_takes_what_the_sum_leaves() -> None:
    m = RequestMetrics()
    before = _scrape(m)
    _observe(m, 200.0)  # above the last TTFT bound (128 s)
    (d,) = [d for d in distributions(before, _scrape(m)) if d.name == names.TTFT]
    assert d.values == [pytest.approx(200.0)] and d.counts == [1]


def test_nothing_new_nothing_published_and_a_reset_counts_from_zero() -> None:
    m = RequestMetrics()
    _observe(m, 0.3)
    _observe(m, 0.3)
    same = _scrape(m)
    assert distributions(same, same) == []
    restarted = RequestMetrics()  # the hop restarted: its counts went down
    _observe(restarted, 0.7)
    (d,) = [d for d in distributions(same, _scrape(restarted)) if d.name == names.TTFT]
    assert d.values == [0.75] and d.counts == [1]
    assert latency_datums(None, same) == []  # first scrape: no interval yet


def test_put_metric_data_accepts_the_distributions() -> None:
    """botocore's Stubber validates the request against the CloudWatch API model (Values, Counts, Unit)."""
    m = RequestMetrics()
    before = _scrape(m)
    for ttft in (0.3, 0.7, 9.0):
        _observe(m, ttft, drafted=4, accepted=4)
    datums = latency_datums(before, _scrape(m))
    assert {d.name for d in datums} == set(names.LATENCY_METRICS)
    data = metric_data(datums, group="g", instance_id="i-1", timestamp=datetime(2026, 1, 1, tzinfo=UTC))
    ttft = next(d for d in data if d["MetricName"] == names.TTFT)
    assert "Value" not in ttft and ttft["Values"] == [0.375, 0.75, 12.0] and ttft["Counts"] == [1.0, 1.0, 1.0]
    client = boto3.client("cloudwatch", region_name="cn-northwest-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(client) as stub:
        stub.add_response("put_metric_data", {}, {"Namespace": names.NAMESPACE, "MetricData": data})
        client.put_metric_data(Namespace=names.NAMESPACE, MetricData=data)
        stub.assert_no_pending_responses()
    bad = [{**ttft, "Values": [1.0], "Counts": "three"}]
    with Stubber(client) as stub, pytest.raises(Exception, match="Counts"):  # negative control: the model checks
        stub.add_response("put_metric_data", {}, {"Namespace": names.NAMESPACE, "MetricData": bad})
        client.put_metric_data(Namespace=names.NAMESPACE, MetricData=bad)


def test_every_hop_histogram_has_a_cloudwatch_name() -> None:
    from gguf_serve.container.metrics.latency import HISTOGRAMS

    assert set(HISTOGRAMS) == set(hop.HISTOGRAMS) - {hop.DURATION}
