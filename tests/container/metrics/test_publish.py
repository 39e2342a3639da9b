"""Publisher.step() over real HTTP against a stand-in llama-server, into moto's CloudWatch.

moto matches get_metric_statistics dimensions as a subset, where CloudWatch matches them exactly, so group-level
values are checked with Maximum/Minimum (both levels carry the same value) and the exact sets with list_metrics.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.derive import HOP_IN_FLIGHT, HOP_OUTPUT_TOKENS, HOP_SHED, Datum
from gguf_serve.container.metrics.publish import Publisher, metric_data
from gguf_serve.container.metrics.scrape import ApiKeySource
from tests.container.metrics.conftest import GROUP, INSTANCE, datapoints, dimension_sets, metrics_text

BOTH_LEVELS = [{names.DIM_GROUP: GROUP}, {names.DIM_GROUP: GROUP, names.DIM_INSTANCE: INSTANCE}]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def publisher(fake_server, cloudwatch, monkeypatch, clock=None, **kw) -> Publisher:
    monkeypatch.setenv("TEST_LLAMA_KEY", fake_server.api_key)
    return Publisher(
        cloudwatch=cloudwatch,
        namespace=names.NAMESPACE,
        group=GROUP,
        instance_id=INSTANCE,
        base_url=fake_server.url,
        api_key=kw.pop("api_key", ApiKeySource(env_name="TEST_LLAMA_KEY")),
        clock=clock or Clock(),
        **kw,
    )


def published(cloudwatch) -> set[str]:
    return {m["MetricName"] for m in cloudwatch.list_metrics(Namespace=names.NAMESPACE)["Metrics"]}


def test_metric_data_doubles_each_datum_at_group_and_instance_level():
    ts = datetime(2026, 1, 1, tzinfo=UTC)
    data = metric_data([Datum("A", 1, "Count"), Datum("B", 2.5, "Percent")], group="g", instance_id="i-1", timestamp=ts)
    assert [(d["MetricName"], [x["Name"] for x in d["Dimensions"]]) for d in data] == [
        ("A", ["AutoScalingGroupName"]),
        ("A", ["AutoScalingGroupName", "InstanceId"]),
        ("B", ["AutoScalingGroupName"]),
        ("B", ["AutoScalingGroupName", "InstanceId"]),
    ]
    assert {d["Dimensions"][-1]["Value"] for d in data} == {"g", "i-1"}
    assert all(d["Timestamp"] == ts and isinstance(d["Value"], float) for d in data)
    with pytest.raises(ValueError, match="1002 datums"):
        metric_data([Datum("A", 1, "Count")] * 501, group="g", instance_id="i-1", timestamp=ts)


def hop_lines(shed: int, in_flight: int, output_tokens: int = 0) -> str:
    """The families the hop appends to llama-server's /metrics (gguf_serve/container/hop/names.py)."""
    return (f"# TYPE {HOP_SHED} counter\n{HOP_SHED} {shed}\n"
            f"# TYPE {HOP_IN_FLIGHT} gauge\n{HOP_IN_FLIGHT} {in_flight}\n"
            f"# TYPE {HOP_OUTPUT_TOKENS} counter\n{HOP_OUTPUT_TOKENS} {output_tokens}\n")  # fmt: skip


def test_two_scrapes_publish_every_metric_with_both_dimension_sets(fake_server, cloudwatch, monkeypatch):
    clock = Clock()
    pub = publisher(fake_server, cloudwatch, monkeypatch, clock)
    fake_server.metrics = metrics_text(
        requests_processing=1, tokens_predicted_total=100, prompt_tokens_total=10,
        spec_decode_num_draft_tokens_total=100, spec_decode_num_accepted_tokens_total=80,
    ) + hop_lines(shed=2, in_flight=1, output_tokens=90)  # fmt: skip
    first = {d.name for d in pub.step()}
    assert first == {names.REQUESTS_PROCESSING, names.REQUESTS_DEFERRED, names.SLOTS_BUSY_RATIO, names.SCRAPE_FAILED,
                     names.HOP_REQUESTS_IN_FLIGHT}  # fmt: skip

    clock.now += 30
    fake_server.metrics = metrics_text(
        requests_processing=3, requests_deferred=2, tokens_predicted_total=700, prompt_tokens_total=310,
        spec_decode_num_draft_tokens_total=300, spec_decode_num_accepted_tokens_total=230,
    ) + hop_lines(shed=7, in_flight=5, output_tokens=690)  # fmt: skip
    pub.step()

    assert published(cloudwatch) == set(names.ALL_METRICS)
    for metric in names.ALL_METRICS:
        assert dimension_sets(cloudwatch, names.NAMESPACE, metric) == BOTH_LEVELS, metric
    expect = {  # (minimum, maximum, sample count) per dimension set; rates need two scrapes, gauges come from both
        names.GENERATED_TPS: (20.0, 20.0, 1, "Count/Second"),
        names.PROMPT_TPS: (10.0, 10.0, 1, "Count/Second"),
        names.DRAFT_ACCEPTANCE: (75.0, 75.0, 1, "Percent"),
        names.REQUESTS_PROCESSING: (1.0, 3.0, 2, "Count"),
        names.REQUESTS_DEFERRED: (0.0, 2.0, 2, "Count"),
        names.SLOTS_BUSY_RATIO: (25.0, 75.0, 2, "Percent"),  # of the 4 slots /props reports
        names.SCRAPE_FAILED: (0.0, 0.0, 2, "Count"),
        names.HOP_REQUESTS_IN_FLIGHT: (1.0, 5.0, 2, "Count"),  # the hop's gauge, from both scrapes
        names.REQUESTS_SHED: (5.0, 5.0, 1, "Count"),  # 429s between the scrapes: the counter went 2 -> 7
        names.OUTPUT_TOKENS: (600.0, 600.0, 1, "Count"),  # tokens of the answers relayed between the scrapes
    }
    assert set(expect) == set(names.ALL_METRICS)
    for metric, (low, high, count, unit) in expect.items():
        # moto matches dimensions as a subset: the group-level query also sees the instance-level datums
        for dims, factor in zip(BOTH_LEVELS, (2, 1), strict=True):
            (point,) = datapoints(cloudwatch, names.NAMESPACE, metric, dims)
            got = (point["Minimum"], point["Maximum"], point["SampleCount"])
            assert got == (pytest.approx(low), pytest.approx(high), count * factor), (metric, dims)
            assert point["Unit"] == unit, metric
    assert [r for r in fake_server.requests if r[0] == "/props"] == [("/props", "Bearer fake-key")]


def test_failed_scrape_publishes_scrape_failed_and_one_log_line(fake_server, cloudwatch, monkeypatch, caplog):
    pub = publisher(fake_server, cloudwatch, monkeypatch, api_key=ApiKeySource())  # no key: the server says 401
    with caplog.at_level(logging.INFO, logger="gguf-serve-metrics"):
        datums = pub.step()
    assert datums == [Datum(names.SCRAPE_FAILED, 1.0, "Count")]
    assert [r.getMessage() for r in caplog.records] == [
        f"scrape failed: GET {fake_server.url}/metrics: HTTP 401 Invalid API Key"
    ]
    assert published(cloudwatch) == {names.SCRAPE_FAILED}
    for dims in BOTH_LEVELS:
        (point,) = datapoints(cloudwatch, names.NAMESPACE, names.SCRAPE_FAILED, dims)
        assert point["Maximum"] == 1.0


@pytest.mark.parametrize(
    ("metrics", "message"),
    [
        ("llamacpp:requests_processing {oops\n", "unparseable answer: line 1"),
        (None, "Connection refused"),
    ],
)
def test_other_scrape_failures_do_not_raise(fake_server, cloudwatch, monkeypatch, caplog, metrics, message):
    pub = publisher(fake_server, cloudwatch, monkeypatch)
    if metrics is None:
        fake_server.close()
    else:
        fake_server.metrics = metrics
    assert pub.step() == [Datum(names.SCRAPE_FAILED, 1.0, "Count")]
    assert message in caplog.text


def test_failure_between_scrapes_keeps_the_last_good_baseline(fake_server, cloudwatch, monkeypatch):
    clock = Clock()
    pub = publisher(fake_server, cloudwatch, monkeypatch, clock)
    fake_server.metrics = metrics_text(tokens_predicted_total=100)
    pub.step()
    clock.now += 60
    fake_server.api_key = "rotated"
    assert [d.name for d in pub.step()] == [names.SCRAPE_FAILED]
    clock.now += 60
    monkeypatch.setenv("TEST_LLAMA_KEY", "rotated")  # the key is read again on each scrape
    fake_server.metrics = metrics_text(tokens_predicted_total=1300)
    got = {d.name: d.value for d in pub.step()}
    assert got[names.GENERATED_TPS] == pytest.approx(10.0)  # 1200 tokens over the 120 s since the good scrape


def test_server_restart_is_seen_from_the_start_time_header(fake_server, cloudwatch, monkeypatch, caplog):
    clock = Clock()
    pub = publisher(fake_server, cloudwatch, monkeypatch, clock)
    fake_server.metrics = metrics_text(tokens_predicted_total=500)
    pub.step()
    clock.now += 50
    fake_server.start_time = "2000"
    fake_server.metrics = metrics_text(tokens_predicted_total=600)  # grew past the old value after the restart
    with caplog.at_level(logging.INFO, logger="gguf-serve-metrics"):
        got = {d.name: d.value for d in pub.step()}
    assert got[names.GENERATED_TPS] == pytest.approx(12.0)  # 600 since the restart, not 100
    assert "llama-server restarted" in caplog.text
    assert len([r for r in fake_server.requests if r[0] == "/props"]) == 2  # slots read again after a restart


def test_counter_drop_without_header_is_not_negative(fake_server, cloudwatch, monkeypatch):
    clock = Clock()
    pub = publisher(fake_server, cloudwatch, monkeypatch, clock)
    fake_server.metrics = metrics_text(tokens_predicted_total=500, prompt_tokens_total=80)
    pub.step()
    clock.now += 60
    fake_server.metrics = metrics_text(tokens_predicted_total=60, prompt_tokens_total=0)
    pub.step()
    for metric in (names.GENERATED_TPS, names.PROMPT_TPS):
        (point,) = datapoints(cloudwatch, names.NAMESPACE, metric, BOTH_LEVELS[1])
        assert point["Minimum"] >= 0, metric
    (point,) = datapoints(cloudwatch, names.NAMESPACE, names.GENERATED_TPS, BOTH_LEVELS[1])
    assert point["Maximum"] == pytest.approx(1.0)


def test_props_unavailable_skips_busy_ratio_and_warns_once(fake_server, cloudwatch, monkeypatch, caplog):
    fake_server.props = None
    pub = publisher(fake_server, cloudwatch, monkeypatch)
    with caplog.at_level(logging.WARNING, logger="gguf-serve-metrics"):
        for _ in range(3):
            assert names.SLOTS_BUSY_RATIO not in {d.name for d in pub.step()}
    assert len(caplog.records) == 1 and "/props: HTTP 404" in caplog.text
    fake_server.props = {"total_slots": 2}
    fake_server.metrics = metrics_text(requests_processing=1)
    assert {d.name: d.value for d in pub.step()}[names.SLOTS_BUSY_RATIO] == 50.0


def test_slots_argument_wins_over_props(fake_server, cloudwatch, monkeypatch):
    pub = publisher(fake_server, cloudwatch, monkeypatch, slots=8)
    fake_server.metrics = metrics_text(requests_processing=2)
    assert {d.name: d.value for d in pub.step()}[names.SLOTS_BUSY_RATIO] == 25.0
    assert not [r for r in fake_server.requests if r[0] == "/props"]


def test_cloudwatch_failure_is_logged_not_raised(fake_server, monkeypatch, caplog):
    class Broken:
        def put_metric_data(self, **kw):
            raise ConnectionError("endpoint unreachable")

    pub = publisher(fake_server, Broken(), monkeypatch)
    assert names.REQUESTS_PROCESSING in {d.name for d in pub.step()}
    assert "put_metric_data failed: ConnectionError: endpoint unreachable" in caplog.text
