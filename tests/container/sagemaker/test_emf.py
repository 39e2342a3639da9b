"""The container's metrics as EMF lines: what CloudWatch Logs extracts, checked against the specification's rules."""

from __future__ import annotations

import json
import math

from gguf_serve.container.hop import names as hop_names
from gguf_serve.container.hop.drain import DrainState
from gguf_serve.container.hop.metrics import RequestMetrics, RequestRecord
from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.derive import Datum
from gguf_serve.container.metrics.prometheus import parse_prometheus
from gguf_serve.container.metrics.publish import latency_datums
from gguf_serve.container.sagemaker.emf import PIPE_BUF, drain_datums, emf_lines

DIMS = {"EndpointName": "GravitonMoeSageMakerStack", "VariantName": "AllTraffic"}


def _check_emf(line: str) -> dict:
    """The rules of the EMF specification a line must meet for CloudWatch Logs to extract it."""
    doc = json.loads(line)
    meta = doc["_aws"]
    assert isinstance(meta["Timestamp"], int)
    (directive,) = meta["CloudWatchMetrics"]
    assert directive["Namespace"] == names.NAMESPACE
    for dimension_set in directive["Dimensions"]:
        assert all(isinstance(doc[d], str) for d in dimension_set)  # every dimension is a member of the root
    assert 0 < len(directive["Metrics"]) <= 100
    for m in directive["Metrics"]:
        assert m["Unit"] in ("Count", "Seconds", "Percent", "Count/Second")
        assert m["Name"] in doc  # every metric's value is a member of the root
    return doc


def test_gauges_share_a_line_and_each_distribution_has_its_own():
    dist = Datum(names.TTFT, 0.3, "Seconds", values=(0.075, 0.375), counts=(2.0, 1.0))
    lines = emf_lines(
        [Datum(names.REQUESTS_PROCESSING, 2.0, "Count"), dist, Datum(names.SLOTS_BUSY_RATIO, 100.0, "Percent")],
        dimensions=DIMS, timestamp_ms=1_700_000_000_000, host="i-0abc",
    )  # fmt: skip
    assert len(lines) == 2
    gauges, ttft = (_check_emf(line) for line in lines)
    assert gauges[names.REQUESTS_PROCESSING] == 2.0 and gauges[names.SLOTS_BUSY_RATIO] == 100.0
    assert gauges["host"] == "i-0abc" and gauges["EndpointName"] == "GravitonMoeSageMakerStack"
    value = ttft[names.TTFT]
    assert value["Values"] == [0.075, 0.375] and value["Counts"] == [2.0, 1.0]
    assert value["Count"] == 3.0 and math.isclose(value["Sum"], 0.525)
    assert value["Min"] == 0.075 and value["Max"] == 0.375


def test_the_hops_histograms_become_distributions_that_fit_one_atomic_write():
    metrics = RequestMetrics()
    before = parse_prometheus(metrics.exposition())
    for i in range(200):  # every bucket of every histogram gets observations
        r = RequestRecord(started=0.0, stream=True, status=200)
        for k in range(30):
            r.token(0.01 * (i % 13 + 1) + 0.003 * k * (i % 7))
        r.timings = {"prompt_ms": 10.0 * i, "predicted_ms": 40.0 * i, "predicted_n": 30, "predicted_per_second":
                     float(i % 300), "draft_n": 10, "draft_n_accepted": i % 11}  # fmt: skip
        r.finished = 0.5 * (i % 40) + 1
        metrics.observe(r)
    datums = latency_datums(before, parse_prometheus(metrics.exposition()))
    assert {d.name for d in datums} == set(names.LATENCY_METRICS)
    lines = emf_lines(datums, dimensions=DIMS, timestamp_ms=1, host="ip-10-0-0-1")
    assert len(lines) == len(datums)
    for line in lines:
        doc = _check_emf(line)
        (metric,) = doc["_aws"]["CloudWatchMetrics"][0]["Metrics"]
        value = doc[metric["Name"]]
        assert len(value["Values"]) <= len(hop_names.BUCKETS[hop_names.TTFT]) + 5
        assert len((line + "\n").encode()) <= PIPE_BUF  # never interleaved with llama-server's own output
    itl = next(d for d in datums if d.name == names.INTER_TOKEN_LATENCY)
    assert sum(itl.counts) == 200 * 29  # every gap is counted, none sampled away


def test_a_drain_is_one_line_that_counts_what_it_cut():
    drain = DrainState("SIGTERM", deadline=0.0, started=100.0, finished=3, refused=2, cut=1, ended=125.0)
    (line,) = emf_lines(drain_datums(drain), dimensions=DIMS, timestamp_ms=1, host="h")
    doc = _check_emf(line)
    assert doc[names.DRAIN_STREAMS_CUT] == 1 and doc[names.DRAIN_STREAMS_FINISHED] == 3
    assert doc[names.DRAIN_REFUSED] == 2 and doc[names.DRAINS] == 1 and doc[names.DRAIN_SECONDS] == 25.0
