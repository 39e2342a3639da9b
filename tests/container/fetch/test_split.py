"""The end of a download runs on every connection: a connection that ran dry takes half of the slowest range."""

from __future__ import annotations

import hashlib
import random
import time
from pathlib import Path

from gguf_serve.container.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB, RangedDownload, _Pass
from gguf_serve.local.hub import LocalScope
from tests.container.fetch.conftest import sha256_of

REPO, FILE = "test/split-GGUF", "split.bin"


def test_a_straggling_range_is_split_and_the_file_verified(hub: LocalScope, tmp_path: Path) -> None:
    data = random.Random(5).randbytes(20 * MIB)
    (hub.root / REPO).mkdir(parents=True)
    (hub.root / REPO / FILE).write_bytes(data)
    hub.faults.bandwidth_bps = 4e6  # per connection: the 4 MiB part ends after 1 s, with 12 MiB of the other to go
    spec = FileSpec(REPO, FILE, sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    r = fetch_file(spec, tmp_path, endpoint=hub.url, connections=2, part_size=16 * MIB, progress=False)
    assert sha256_of(r.path) == spec.sha256 and r.transferred == len(data)
    assert r.splits >= 1
    deadline = time.monotonic() + 10  # the hub records a request whose reader left when its next send fails
    while len(hub.stats.downloads()) < 2 + r.splits and time.monotonic() < deadline:
        time.sleep(0.05)
    ranges = sorted(q["range"] for q in hub.stats.downloads())
    assert len(ranges) == 2 + r.splits and "bytes=0-16777215" in ranges  # the split half is a request of its own


def _pass(tmp_path: Path, size: int, part: int) -> _Pass:
    dl = RangedDownload(tmp_path / "x.gguf", size=size, sha256="0" * 64, connections=4, part_size=part)
    return _Pass(dl, source=None)  # type: ignore[arg-type]  # no thread runs: the layout alone


def test_a_split_leaves_saved_progress_a_prefix_of_each_part(tmp_path: Path) -> None:
    one = _pass(tmp_path, 3 * 8 * MIB, 8 * MIB)
    first = one.pending.pop()
    one.active.add(first)
    first.written = MIB
    one.received, one.began = 0, one.began  # no rate known yet: the split is decided on size alone
    taken = one._steal()
    assert taken is not None and (taken.part, taken.end) == (0, 8 * MIB)
    assert first.end == taken.start and first.end % (64 * 1024) == 0 and first.start + MIB < first.end
    assert one.ranges[:2] == [first, taken]  # in file order, before part 1
    taken.written = 2 * MIB  # the second half moves on while the first has a gap
    assert one._prefixes() == {"0": MIB}
    first.written = first.end - first.start  # the gap closes: the prefix runs on into the taken half
    assert one._prefixes() == {"0": first.written + 2 * MIB}


def test_a_range_ending_soon_at_the_connections_rate_is_not_split(tmp_path: Path) -> None:
    one = _pass(tmp_path, 8 * MIB, 8 * MIB)
    only = one.pending.pop()
    one.active.add(only)
    one.received, one.began = 400 * MIB, one.began - 1.0  # 400 MiB/s: 8 MiB is 20 ms
    assert one._steal() is None
    assert len(one.ranges) == 1
