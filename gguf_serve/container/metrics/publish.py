"""One publishing cycle: scrape llama-server, derive the values, put them to CloudWatch at two dimension levels."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.derive import COUNT, Datum, Scrape, derive
from gguf_serve.container.metrics.latency import distributions
from gguf_serve.container.metrics.scrape import ApiKeySource, ScrapeError, fetch_total_slots, scrape_metrics

log = logging.getLogger("gguf-serve-metrics")

MAX_DATUMS_PER_CALL = 1000  # PutMetricData's limit


def metric_data(datums: list[Datum], *, group: str, instance_id: str, timestamp: datetime) -> list[dict[str, Any]]:
    """Each datum twice: per group (what scaling policies and alarms read) and per instance."""
    levels = (
        [{"Name": names.DIM_GROUP, "Value": group}],
        [{"Name": names.DIM_GROUP, "Value": group}, {"Name": names.DIM_INSTANCE, "Value": instance_id}],
    )
    data = [
        {"MetricName": d.name, "Dimensions": dims, "Timestamp": timestamp, "Unit": d.unit, **_values(d)}
        for d in datums
        for dims in levels
    ]
    if len(data) > MAX_DATUMS_PER_CALL:
        raise ValueError(f"{len(data)} datums exceed PutMetricData's {MAX_DATUMS_PER_CALL}")
    return data


def _values(d: Datum) -> dict[str, Any]:
    if d.values:
        return {"Values": [float(v) for v in d.values], "Counts": [float(c) for c in d.counts]}
    return {"Value": float(d.value)}


def latency_datums(prev: Scrape | None, cur: Scrape) -> list[Datum]:
    """The hop's histograms as CloudWatch distributions; nothing on the first scrape (no interval yet)."""
    if prev is None:
        return []
    return [
        Datum(d.name, sum(v * c for v, c in zip(d.values, d.counts, strict=True)) / sum(d.counts), d.unit,
              tuple(d.values), tuple(d.counts))
        for d in distributions(prev, cur)
    ]  # fmt: skip


@dataclass
class Publisher:
    cloudwatch: Any  # a boto3 CloudWatch client; None with dry_run
    namespace: str
    group: str
    instance_id: str
    base_url: str
    api_key: ApiKeySource
    slots: int | None = None  # None: read total_slots from /props
    timeout_s: float = 10.0
    dry_run: bool = False
    clock: Callable[[], float] = time.monotonic
    _prev: Scrape | None = field(default=None, init=False)
    _prev_at: float = field(default=0.0, init=False)
    _start_time: str | None = field(default=None, init=False)
    _props_slots: int | None = field(default=None, init=False)
    _props_warned: bool = field(default=False, init=False)

    def step(self) -> list[Datum]:
        """Scrape once and publish; a failed scrape publishes ScrapeFailed=1. Returns what was published."""
        at = self.clock()
        timestamp = datetime.now(UTC)
        try:
            key = self.api_key.read()
            scrape = scrape_metrics(self.base_url, key, self.timeout_s)
        except ScrapeError as e:
            log.warning("scrape failed: %s", e)
            datums = [Datum(names.SCRAPE_FAILED, 1.0, COUNT)]
        else:
            restarted = self._prev is not None and scrape.start_time != self._start_time
            if restarted:
                log.info("llama-server restarted (start time %s -> %s)", self._start_time, scrape.start_time)
                self._props_slots = None
            datums = derive(
                self._prev,
                scrape.families,
                at - self._prev_at,
                slots=self._total_slots(key),
                restarted=restarted,
            )
            datums += latency_datums(self._prev, scrape.families)
            datums.append(Datum(names.SCRAPE_FAILED, 0.0, COUNT))
            self._prev, self._prev_at, self._start_time = scrape.families, at, scrape.start_time
        self._put(datums, timestamp)
        return datums

    def _total_slots(self, key: str | None) -> int | None:
        if self.slots:
            return self.slots
        if self._props_slots is None:
            try:
                self._props_slots = fetch_total_slots(self.base_url, key, self.timeout_s)
            except ScrapeError as e:
                if not self._props_warned:
                    log.warning("no SlotsBusyRatio until /props answers (or pass --slots): %s", e)
                self._props_warned = True
        return self._props_slots

    def _put(self, datums: list[Datum], timestamp: datetime) -> None:
        data = metric_data(datums, group=self.group, instance_id=self.instance_id, timestamp=timestamp)
        summary = " ".join(f"{d.name}={d.value:g}" for d in datums)
        if self.dry_run:
            log.info("dry run, not published: %s", summary)
            return
        try:
            self.cloudwatch.put_metric_data(Namespace=self.namespace, MetricData=data)
        except Exception as e:  # a CloudWatch outage or missing credentials must not stop the loop
            log.warning("put_metric_data failed: %s: %s", type(e).__name__, e)
        else:
            log.debug("published %d datums: %s", len(data), summary)
