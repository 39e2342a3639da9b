"""Prometheus histograms and their text exposition (format 0.0.4), thread-safe, standard library only."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Sequence


def format_value(value: float) -> str:
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == int(value) and abs(value) < 1e15:
        return str(int(value))
    return repr(float(value))


class Histogram:
    """Cumulative buckets, _sum and _count, as prometheus_client writes them (no labels)."""

    def __init__(self, name: str, help_text: str, buckets: Sequence[float]) -> None:
        if list(buckets) != sorted(set(buckets)) or not buckets:
            raise ValueError(f"{name}: buckets must be strictly increasing, got {buckets}")
        self.name = name
        self.help = help_text
        self.bounds = [float(b) for b in buckets if not math.isinf(b)]
        self._counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, value: float, count: int = 1) -> None:
        """Record `value` `count` times (a non-streamed request's mean gap stands for each of its gaps)."""
        if count < 1 or not math.isfinite(value):
            return
        i = bisect.bisect_left(self.bounds, value)  # le is inclusive: value == bound lands in that bucket
        with self._lock:
            self._counts[i] += count
            self._sum += value * count

    def observe_each(self, values: Iterable[float]) -> None:
        """Record every one of `values` (a streamed request's gaps between tokens): sorted once, then one bisection
        per bucket bound, under one lock. A call of observe per value cost the hop 4,800 instructions per token."""
        finite = sorted(filter(math.isfinite, values))
        if not finite:
            return
        # bisect_right: a value equal to a bound counts at or under it, as observe's bisect_left bins it
        at_or_under = [bisect.bisect_right(finite, bound) for bound in self.bounds]
        at_or_under.append(len(finite))
        total = sum(finite)
        with self._lock:
            below = 0
            for i, cumulative in enumerate(at_or_under):
                self._counts[i] += cumulative - below
                below = cumulative
            self._sum += total

    def snapshot(self) -> tuple[list[tuple[float, int]], float, int]:
        """(cumulative (le, count) pairs ending with +Inf, sum, count)."""
        with self._lock:
            counts, total_sum = list(self._counts), self._sum
        cumulative, running = [], 0
        for bound, n in zip([*self.bounds, math.inf], counts, strict=True):
            running += n
            cumulative.append((bound, running))
        return cumulative, total_sum, running

    def exposition(self) -> str:
        buckets, total_sum, count = self.snapshot()
        lines = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        lines += [f'{self.name}_bucket{{le="{format_value(le)}"}} {n}' for le, n in buckets]
        lines += [f"{self.name}_sum {format_value(total_sum)}", f"{self.name}_count {count}"]
        return "\n".join(lines) + "\n"
