"""A STREAM-style read probe: how many GB/s this host's cores can read from memory, the roof decode runs under.

Each thread sums its own slice of one array far larger than the caches (numpy's reduction releases the GIL, so
the threads read in parallel); the best of several passes counts, as STREAM reports its best time. Only reads:
decode reads weights and writes little. Run it on the serving host (the instance, over SSM), not on a client
that only reaches the endpoint, and before a benchmark, not beside one: llama-server reading weights would
share the bus. It measures host RAM; a GPU's decode reads device memory, which this does not see.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

DEFAULT_MIB = 1024  # 1 GiB: well past any L3 here (tens of MiB), small enough for a 2-core laptop
PASSES = 5
MIN_MIB = 64


@dataclass(frozen=True)
class Bandwidth:
    gb_s: float  # best pass, decimal GB/s
    threads: int
    array_bytes: int
    passes: int
    pass_gb_s: tuple[float, ...]
    host: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def measure(*, mib: int = DEFAULT_MIB, threads: int | None = None, passes: int = PASSES) -> Bandwidth:
    """Read `mib` MiB with `threads` threads (default: every CPU here) `passes` times; the best pass counts."""
    import numpy as np

    if mib < MIN_MIB:
        raise ValueError(f"--probe-mib {mib}: at least {MIN_MIB} MiB, or the caches answer instead of memory")
    threads = threads or os.cpu_count() or 1
    data = np.ones(mib * 1024 * 1024 // 8, dtype=np.float64)  # written once: every page is real before timing
    slices = np.array_split(data, threads)
    sums = [0.0] * threads

    def read(i: int) -> None:
        sums[i] = float(slices[i].sum())

    rates = []
    for _ in range(passes):
        workers = [threading.Thread(target=read, args=(i,)) for i in range(threads)]
        start = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = time.perf_counter() - start
        if sum(sums) != data.size:  # every slice was read: ones sum to their count
            raise RuntimeError("the probe's threads did not read the whole array")
        rates.append(data.nbytes / elapsed / 1e9)
    return Bandwidth(
        gb_s=max(rates),
        threads=threads,
        array_bytes=data.nbytes,
        passes=passes,
        pass_gb_s=tuple(round(r, 2) for r in rates),
        host=os.uname().nodename,
    )


def line(b: Bandwidth) -> str:
    return (
        f"bandwidth: {b.gb_s:.1f} GB/s read by {b.threads} threads over {b.array_bytes / 2**20:,.0f} MiB "
        f"(best of {b.passes}: {', '.join(f'{r:.1f}' for r in b.pass_gb_s)})"
    )
