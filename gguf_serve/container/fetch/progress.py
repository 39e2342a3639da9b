"""Progress: a one-line bar on a terminal, a plain log line every so often otherwise (instance logs)."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("gguf-serve-fetch")


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    raise AssertionError("unreachable")


def human_duration(s: float) -> str:
    s = int(max(0, s))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s}s"


class Progress:
    """Receives (done, total) updates from the download's monitor thread."""

    def __init__(
        self,
        label: str,
        *,
        stream: TextIO | None = None,
        tty: bool | None = None,
        log_every_s: float = 15.0,
    ) -> None:
        self.label = label
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty() if tty is None else tty
        self.log_every_s = log_every_s
        self._t0 = time.monotonic()
        self._start_bytes: int | None = None
        self._last_log = float("-inf")
        self._drawn = False
        self._logged_end = False

    def update(self, done: int, total: int) -> None:
        now = time.monotonic()
        if self._start_bytes is None:
            self._start_bytes, self._t0 = done, now
            if done:
                log.info("%s: resuming, %s of %s already on disk", self.label, human_bytes(done), human_bytes(total))
        elapsed = max(now - self._t0, 1e-6)
        rate = (done - self._start_bytes) / elapsed
        eta = (total - done) / rate if rate > 0 else float("inf")
        pct = 100.0 * done / total if total else 100.0
        eta_s = human_duration(eta) if eta != float("inf") else "?"
        if self.tty:
            width = 30
            fill = int(width * done / total) if total else width
            bar = "#" * fill + "-" * (width - fill)
            self.stream.write(
                f"\r{self.label} [{bar}] {pct:5.1f}% {human_bytes(done)}/{human_bytes(total)} "
                f"{rate / 1e6:7.1f} MB/s eta {eta_s}\x1b[K"
            )
            self.stream.flush()
            self._drawn = True
        elif now - self._last_log >= self.log_every_s or (done >= total and not self._logged_end):
            self._last_log = now
            self._logged_end = done >= total
            log.info(
                "%s: %s of %s (%.1f%%) at %.1f MB/s, eta %s",
                self.label,
                human_bytes(done),
                human_bytes(total),
                pct,
                rate / 1e6,
                eta_s,
            )

    def close(self) -> None:
        if self._drawn:
            self.stream.write("\n")
            self.stream.flush()
            self._drawn = False
