"""Histogram text and per-request arithmetic, read back with the fleet's own Prometheus parser."""

from __future__ import annotations

import math

import pytest

from gguf_serve.container.hop import names
from gguf_serve.container.hop.histogram import Histogram
from gguf_serve.container.hop.metrics import RequestMetrics, RequestRecord, SseTokenScanner, carries_text
from gguf_serve.container.metrics.prometheus import parse_prometheus


def test_histogram_is_cumulative_with_inclusive_upper_bounds() -> None:
    h = Histogram("x_seconds", "help", (0.1, 1, 10))
    for v in (0.05, 0.1, 0.5, 1, 20):
        h.observe(v)
    h.observe(2, count=3)
    fam = parse_prometheus(h.exposition())["x_seconds"]
    assert fam.type == "histogram"
    assert [fam.value(le=le) for le in ("0.1", "1", "10", "+Inf")] == [2, 4, 7, 8]
    assert fam.samples[-1].name == "x_seconds_count" and fam.samples[-1].value == 8
    assert fam.samples[-2].value == pytest.approx(0.05 + 0.1 + 0.5 + 1 + 20 + 6)


def test_histogram_refuses_unsorted_buckets_and_ignores_nan() -> None:
    with pytest.raises(ValueError, match="strictly increasing"):
        Histogram("x", "h", (1, 0.5))
    h = Histogram("x", "h", (1,))
    h.observe(math.nan)
    h.observe(math.inf)
    assert h.snapshot()[2] == 0


def test_observe_each_bins_as_observe_does() -> None:
    """A streamed request's gaps go in at once (observe_each): the same buckets, sum and count as one at a time,
    bounds inclusive, what is not finite left out."""
    values = [0.0, 0.05, 0.1, 0.1000001, 0.5, 1, 1, 9.99, 10, 20, math.inf, math.nan, -1]
    one, each = Histogram("x", "h", (0.1, 1, 10)), Histogram("x", "h", (0.1, 1, 10))
    for v in values:
        one.observe(v)
    each.observe_each(iter(values))
    each.observe_each([])
    assert each.snapshot()[0] == one.snapshot()[0] == [(0.1, 4), (1, 8), (10, 10), (math.inf, 11)]
    assert each.snapshot()[1] == pytest.approx(one.snapshot()[1])
    assert each.snapshot()[2] == one.snapshot()[2] == 11


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"choices":[{"delta":{"content":"a"}}]}', True),
        (b'{"choices":[{"delta":{"role":"assistant","content":null}}]}', False),
        (b'{"choices":[{"delta":{"content":""}}]}', False),
        (b'{"choices":[{"delta":{"reasoning_content":"hm"}}]}', True),
        (b'{"choices":[{"text":"x","index":0}]}', True),
        (b'{"content":"x","stop":false}', True),
        (b'{"choices":[{"delta":{}}],"timings":{"prompt_n":1}}', False),
        (b'{"choices":[{"delta":{"tool_calls":[{"index":0}]}}]}', True),
        (b'{"choices":[{"delta":{"content":""}}],"note":"say \\"content\\":\\"x"}', False),
    ],
)
def test_carries_text(payload: bytes, expected: bool) -> None:
    assert carries_text(payload) is expected


def test_scanner_reads_events_split_anywhere() -> None:
    stream = (
        b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n'
        b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n'
        b'data: {"choices":[{"delta":{}}],"timings":{"prompt_ms":5,"predicted_ms":9}}\n\ndata: [DONE]\n\n'
    )
    record = RequestRecord(started=0.0)
    scanner = SseTokenScanner(record)
    for i in range(0, len(stream), 7):  # 7-byte pieces split lines, keys and JSON
        scanner.feed(stream[i : i + 7], at=float(i))
    assert record.first_token is not None and record.last_token is not None
    assert len(record.gaps) == 1 and record.gaps[0] == record.last_token - record.first_token
    assert record.timings == {"prompt_ms": 5, "predicted_ms": 9}


def test_scanner_reads_one_whole_event_per_feed_as_it_reads_any_split() -> None:
    """llama-server writes one event per chunk: a whole event is read in one step, with the same result."""
    events = [b'data: {"choices":[{"delta":{"content":"a"}}]}\n\n', b": keep-alive\n\n", b"\n\n",
              b'data: {"choices":[{"delta":{"content":"b"}}]}\n\n', b'data:{"timings":{"predicted_ms":9}}\n\n',
              b'data: {"choices":[{"delta":{"content":"c', b'"}}]}\n\n', b"data: [DONE]\n\n"]  # fmt: skip
    whole, split = RequestRecord(started=0.0), RequestRecord(started=0.0)
    by_event, by_byte = SseTokenScanner(whole), SseTokenScanner(split)
    stream = b"".join(events)
    offsets = [sum(map(len, events[:i])) for i in range(len(events))]
    for at, event in zip(offsets, events, strict=True):
        by_event.feed(event, at=float(at))
    for i in range(len(stream)):
        by_byte.feed(stream[i : i + 1], at=float(next(o for o in reversed(offsets) if o <= i)))
    assert by_event.done and by_byte.done
    assert (whole.first_token, whole.gaps, whole.timings) == (split.first_token, split.gaps, split.timings)
    assert len(whole.gaps) == 2 and whole.timings == {"predicted_ms": 9}


def _families(m: RequestMetrics):
    return parse_prometheus(m.exposition())


def test_streamed_request_feeds_every_histogram() -> None:
    m = RequestMetrics()
    r = RequestRecord(started=10.0, stream=True, status=200, finished=11.0)
    for t in (10.5, 10.6, 10.8):
        r.token(t)
    r.timings = {"prompt_ms": 300, "predicted_ms": 400, "predicted_n": 3, "predicted_per_second": 7.5,
                 "draft_n": 4, "draft_n_accepted": 3}  # fmt: skip
    m.observe(r)
    f = _families(m)
    assert f[names.TTFT].samples[-2].value == pytest.approx(0.5)
    assert f[names.ITL].samples[-1].value == 2 and f[names.ITL].samples[-2].value == pytest.approx(0.3)
    assert f[names.QUEUE_WAIT].samples[-2].value == pytest.approx(1.0 - 0.7)
    assert f[names.DECODE_TPS].samples[-2].value == pytest.approx(7.5)
    assert f[names.DRAFT_ACCEPTANCE].samples[-2].value == pytest.approx(0.75)
    assert f[names.DURATION].samples[-2].value == pytest.approx(1.0)
    assert f[names.REQUESTS].value(code="200", stream="true") == 1


def test_non_streamed_request_derives_ttft_and_gaps_from_timings() -> None:
    m = RequestMetrics()
    r = RequestRecord(started=0.0, stream=False, status=200, finished=2.0)
    r.timings = {"prompt_ms": 500, "predicted_ms": 1000, "predicted_n": 10, "predicted_per_second": 10}
    m.observe(r)
    f = _families(m)
    assert f[names.TTFT].samples[-2].value == pytest.approx(2.0 - 1.0 + 0.1)  # wait + prompt, then one token
    assert f[names.ITL].samples[-1].value == 9 and f[names.ITL].samples[-2].value == pytest.approx(0.9)
    assert f[names.DRAFT_ACCEPTANCE].samples[-1].value == 0  # no drafts, no observation


def test_failed_and_abandoned_requests_are_counted_not_timed() -> None:
    m = RequestMetrics()
    m.observe(RequestRecord(started=0.0, status=401, finished=0.1))
    m.observe(RequestRecord(started=0.0, stream=True, status=200, finished=0.1, client_closed=True))
    f = _families(m)
    assert f[names.REQUESTS].value(code="401", stream="false") == 1
    assert f[names.REQUESTS].value(code="client_closed", stream="true") == 1
    assert all(f[n].samples[-1].value == 0 for n in names.HISTOGRAMS)


def test_a_request_is_counted_once_whichever_end_reports_it() -> None:
    """The relay, the exchange's error paths and its last line may each report a record: the first counts it. A
    record timed but not counted is counted by the exchange's last line (an exchange that ended with the client gone
    after the answer's end was timed went uncounted)."""
    metrics = RequestMetrics()
    record = RequestRecord(started=0.0, stream=True, status=200, finished=1.0)
    record.token(0.5)
    for _ in range(3):
        metrics.observe(record)
    assert metrics.histograms[names.TTFT].snapshot()[2] == 1
    assert 'code="200",stream="true"} 1\n' in metrics.exposition()
