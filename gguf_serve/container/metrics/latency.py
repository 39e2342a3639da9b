"""Per-request latency distributions for CloudWatch, from the timing hop's Prometheus histograms.

Each publishing interval, the increase of every bucket becomes one value with a count (PutMetricData `Values`
and `Counts`), so CloudWatch holds the distribution itself and computes p50/p95/p99 across the whole fleet
(`ExtendedStatistic`), which averaging per-instance percentiles cannot do. A bucket's value is its midpoint;
the +Inf bucket's is what the histogram's _sum leaves for it, at least the highest bound. Percentiles are
therefore exact to within half a bucket (gguf_serve/container/hop/names.py lists the buckets).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.prometheus import MetricFamily

MAX_VALUES = 150  # PutMetricData: at most 150 distinct values per datum

# hop histogram (gguf_serve/container/hop/names.py; spelled out so that the metrics publisher runs without the hop
# installed,
# tests/container/metrics/test_latency.py checks they agree) -> (CloudWatch metric, unit, scale to that unit)
HISTOGRAMS = {
    "gguf_serve_time_to_first_token_seconds": (names.TTFT, "Seconds", 1.0),
    "gguf_serve_inter_token_latency_seconds": (names.INTER_TOKEN_LATENCY, "Seconds", 1.0),
    "gguf_serve_queue_wait_seconds": (names.QUEUE_WAIT, "Seconds", 1.0),
    "gguf_serve_decode_tokens_per_second": (names.DECODE_TPS, "Count/Second", 1.0),
    "gguf_serve_draft_acceptance_ratio": (names.REQUEST_DRAFT_ACCEPTANCE, "Percent", 100.0),
}


@dataclass(frozen=True)
class Distribution:
    name: str
    values: list[float]
    counts: list[float]
    unit: str


def _cumulative(family: MetricFamily) -> tuple[list[tuple[float, float]], float, float] | None:
    """([(le, cumulative count)] sorted, sum, count), or None when the family is not a usable histogram."""
    buckets, total_sum, count = [], None, None
    for s in family.samples:
        if s.name == family.name + "_bucket" and "le" in s.labels:
            try:
                buckets.append((float(s.labels["le"]), s.value))
            except ValueError:
                return None
        elif s.name == family.name + "_sum":
            total_sum = s.value
        elif s.name == family.name + "_count":
            count = s.value
    if not buckets or total_sum is None or count is None or not math.isinf(max(b for b, _ in buckets)):
        return None
    return sorted(buckets), total_sum, count


def distributions(
    prev: Mapping[str, MetricFamily] | None, cur: Mapping[str, MetricFamily], *, restarted: bool = False
) -> list[Distribution]:
    """One Distribution per hop histogram that gained observations since `prev` (None: since the hop started)."""
    out = []
    for family_name, (metric, unit, scale) in HISTOGRAMS.items():
        now = _cumulative(cur[family_name]) if family_name in cur else None
        if now is None:
            continue
        before = None if restarted or prev is None or family_name not in prev else _cumulative(prev[family_name])
        if before is not None and (before[2] > now[2] or [b for b, _ in before[0]] != [b for b, _ in now[0]]):
            before = None  # the hop restarted (counts went down) or its buckets changed: count from zero
        out += _distribution(metric, unit, scale, now, before)
    return out


def _distribution(metric, unit, scale, now, before) -> list[Distribution]:
    (buckets, total_sum, count), prev_buckets = now, before[0] if before else None
    delta_count = count - (before[2] if before else 0)
    delta_sum = total_sum - (before[1] if before else 0)
    if delta_count <= 0:
        return []
    values, counts, lower, prev_cum, placed_sum = [], [], 0.0, 0.0, 0.0
    inf_count = 0.0
    for i, (le, cum) in enumerate(buckets):
        increase = cum - (prev_buckets[i][1] if prev_buckets else 0)
        n = max(0.0, increase - prev_cum)
        prev_cum = max(prev_cum, increase)
        if math.isinf(le):
            inf_count = n
            break
        if n:
            mid = (lower + le) / 2
            values.append(mid * scale)
            counts.append(n)
            placed_sum += mid * n
        lower = le
    if inf_count:
        rest = (delta_sum - placed_sum) / inf_count
        values.append(max(rest, lower) * scale)
        counts.append(inf_count)
    if not values:
        return []
    return [Distribution(metric, values[:MAX_VALUES], counts[:MAX_VALUES], unit)]
