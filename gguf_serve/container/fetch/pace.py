"""A minimum transfer rate for every body read, so that a server trickling a byte every few seconds ends in an
error that names the host, instead of a download that never finishes (a per-read timeout alone never fires)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from gguf_serve.container.fetch.errors import TransientError


class TooSlow(TransientError):
    """The body arrived below the minimum rate; it counts as a failure even if some bytes came."""


@dataclass(frozen=True)
class RatePolicy:
    min_bps: float = 64 * 1024  # per connection; ModelScope and S3 in region give megabytes per second
    window_s: float = 30.0  # averaged over this long, so a short stall on a good link is not an error
    idle_s: float = 30.0  # no byte at all for this long: the socket read times out
    headers_s: float = 30.0  # the status line and every header, in all (gguf_serve.container.fetch.deadline)

    def watch(self, host: str, clock: Callable[[], float] = time.monotonic) -> RateWatch:
        return RateWatch(self, host, clock)


class RateWatch:
    """Call `add(n)` after each read; it raises TooSlow once a whole window averaged under the minimum."""

    def __init__(self, policy: RatePolicy, host: str, clock: Callable[[], float]) -> None:
        self.policy = policy
        self.host = host
        self.clock = clock
        self.window_start = clock()
        self.window_bytes = 0

    def add(self, n: int) -> None:
        self.window_bytes += n
        now = self.clock()
        elapsed = now - self.window_start
        if elapsed < self.policy.window_s:
            return
        rate = self.window_bytes / elapsed
        if rate < self.policy.min_bps:
            raise TooSlow(
                f"{self.host} sent {rate:,.0f} B/s over the last {elapsed:.0f} s, below the minimum "
                f"{self.policy.min_bps:,.0f} B/s"
            )
        self.window_start, self.window_bytes = now, 0
