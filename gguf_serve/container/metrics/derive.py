"""Turn two llama-server scrapes into the CloudWatch values in names.py."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.prometheus import MetricFamily

# llama-server's metric names (tools/server/server-task.cpp, server_task_result_metrics::to_metrics)
LLAMA_REQUESTS_PROCESSING = "llamacpp:requests_processing"
LLAMA_REQUESTS_DEFERRED = "llamacpp:requests_deferred"
LLAMA_TOKENS_PREDICTED = "llamacpp:tokens_predicted_total"
LLAMA_PROMPT_TOKENS = "llamacpp:prompt_tokens_total"  # processed prompt tokens, cache hits excluded
LLAMA_DRAFT_TOKENS = "llamacpp:spec_decode_num_draft_tokens_total"
LLAMA_DRAFT_ACCEPTED = "llamacpp:spec_decode_num_accepted_tokens_total"
# The hop's admission families (gguf_serve/container/hop/names.py SHED and IN_FLIGHT, spelled out as in latency.py)
HOP_SHED = "gguf_serve_requests_shed_total"
HOP_IN_FLIGHT = "gguf_serve_requests_in_flight"
HOP_OUTPUT_TOKENS = "gguf_serve_output_tokens_total"

COUNT = "Count"
PER_SECOND = "Count/Second"
PERCENT = "Percent"

Scrape = Mapping[str, MetricFamily]


@dataclass(frozen=True)
class Datum:
    name: str
    value: float  # with values: their weighted mean (for the log line)
    unit: str
    values: tuple[float, ...] = ()  # a distribution: PutMetricData Values and Counts instead of Value
    counts: tuple[float, ...] = ()


def derive(
    prev: Scrape | None,
    cur: Scrape,
    elapsed_s: float,
    *,
    slots: int | None = None,
    restarted: bool = False,
) -> list[Datum]:
    """CloudWatch values from the current scrape and, for rates, the previous one `elapsed_s` seconds earlier.

    prev None (first scrape) or elapsed_s <= 0 gives gauges only. A counter that went down, or `restarted`
    (the server's start time changed), counts from zero, as Prometheus' rate() does: never a negative rate.
    DraftAcceptanceRate appears only when drafts were made in the interval.
    """
    out: list[Datum] = []
    processing = _gauge(cur, LLAMA_REQUESTS_PROCESSING)
    deferred = _gauge(cur, LLAMA_REQUESTS_DEFERRED)
    if processing is not None:
        out.append(Datum(names.REQUESTS_PROCESSING, processing, COUNT))
        if slots:
            out.append(Datum(names.SLOTS_BUSY_RATIO, 100.0 * processing / slots, PERCENT))
    if deferred is not None:
        out.append(Datum(names.REQUESTS_DEFERRED, deferred, COUNT))
    in_flight = _gauge(cur, HOP_IN_FLIGHT)
    if in_flight is not None:
        out.append(Datum(names.HOP_REQUESTS_IN_FLIGHT, in_flight, COUNT))

    if prev is None or not elapsed_s > 0:
        return out
    for metric, counter in ((names.GENERATED_TPS, LLAMA_TOKENS_PREDICTED), (names.PROMPT_TPS, LLAMA_PROMPT_TOKENS)):
        delta = _increase(prev, cur, counter, restarted)
        if delta is not None:
            out.append(Datum(metric, delta / elapsed_s, PER_SECOND))
    shed = _increase(prev, cur, HOP_SHED, False)  # the hop's counter restarts with the hop (a drop), not llama-server
    if shed is not None:
        out.append(Datum(names.REQUESTS_SHED, shed, COUNT))
    served = _increase(prev, cur, HOP_OUTPUT_TOKENS, False)  # as the shed counter: the hop's own
    if served is not None:
        out.append(Datum(names.OUTPUT_TOKENS, served, COUNT))
    drafted = _increase(prev, cur, LLAMA_DRAFT_TOKENS, restarted)
    accepted = _increase(prev, cur, LLAMA_DRAFT_ACCEPTED, restarted)
    if drafted and accepted is not None:
        out.append(Datum(names.DRAFT_ACCEPTANCE, 100.0 * min(accepted, drafted) / drafted, PERCENT))
    return out


def _gauge(scrape: Scrape, name: str) -> float | None:
    family = scrape.get(name)
    value = family.value() if family else None
    return value if value is not None and math.isfinite(value) else None


def _increase(prev: Scrape, cur: Scrape, name: str, restarted: bool) -> float | None:
    now = _gauge(cur, name)
    if now is None:
        return None
    before = None if restarted else _gauge(prev, name)
    if before is None or now < before:
        return max(now, 0.0)
    return now - before
