"""Exponential backoff with full jitter, interruptible by an abort event."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RetryPolicy:
    attempts: int = 8  # consecutive failures without progress before giving up on a range
    base_s: float = 0.5  # first backoff ceiling; doubles per failure
    cap_s: float = 30.0  # longest single wait

    def delay(self, failure: int) -> float:
        """Full jitter (AWS architecture blog): uniform in [0, min(cap, base * 2^(n-1))]."""
        return random.uniform(0, min(self.cap_s, self.base_s * 2 ** (failure - 1)))  # noqa: S311 - not crypto

    def wait(self, failure: int, abort: threading.Event | None = None) -> bool:
        """Sleep before retry number `failure`; False when aborted meanwhile."""
        delay = self.delay(failure)
        if abort is None:
            threading.Event().wait(delay)
            return True
        return not abort.wait(delay)
