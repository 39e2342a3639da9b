"""A hub's answers read with bounds of their own, whatever urllib3 does: a listing with chained content codings (a
275-byte body reached 2-4 GiB with urllib3 2.5.0: CVE-2025-66418/66471) or one coding of a huge body is refused
within a few MiB of memory; an honest gzip listing still works."""

from __future__ import annotations

import functools
import gzip
import json
import tracemalloc
import zlib
from pathlib import Path

import pytest

from gguf_serve.container.fetch import FetchError
from gguf_serve.container.fetch.modelscope import LISTING_MAX_BYTES, ModelScope
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.local.hub import LocalScope
from tests.conftest import SMALL_FILE, SMALL_REPO

MIB = 1024 * 1024
BOMB_MIB = 256  # decoded; the test's memory bound is a tenth of it


@functools.cache
def _bomb(layers: int) -> bytes:
    """gzip of BOMB_MIB MiB of zeros, gzipped again `layers - 1` times (each layer shrinks it about 1000-fold)."""
    z = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    zeros = bytes(MIB)
    data = b"".join(z.compress(zeros) for _ in range(BOMB_MIB)) + z.flush()
    for _ in range(layers - 1):
        data = gzip.compress(data, 9)
    return data


def _peak_mib(hub: LocalScope) -> tuple[float, str]:
    client = ModelScope(hub.url, retry=RetryPolicy(attempts=0))
    tracemalloc.start()
    try:
        client.describe(SMALL_REPO, "master", SMALL_FILE)
        outcome = "read"
    except FetchError as e:
        outcome = str(e)
    finally:
        peak = tracemalloc.get_traced_memory()[1] / MIB
        tracemalloc.stop()
    return peak, outcome


@pytest.mark.parametrize(
    ("encoding", "layers", "refusal"),
    [("gzip, gzip, gzip", 3, "one coding at most"), ("gzip", 1, f"more than {LISTING_MAX_BYTES // MIB} MiB")],
    ids=["chained-codings", "one-coding-huge"],
)
def test_a_listing_bomb_is_refused_in_bounded_memory(hub: LocalScope, small_file, encoding, layers, refusal) -> None:
    bomb = _bomb(layers)
    hub.faults.listing_encoded = (encoding, bomb)
    peak, outcome = _peak_mib(hub)
    print(f"{encoding!r}: {len(bomb):,} bytes on the wire for {BOMB_MIB} MiB decoded: peak {peak:.1f} MiB, {outcome}")
    assert refusal in outcome
    assert peak < BOMB_MIB / 10, f"reading the listing took {peak:.0f} MiB"


def test_an_honest_gzip_listing_is_read(hub: LocalScope, small_file: tuple[Path, str]) -> None:
    listing = {"Code": 200, "Success": True, "Data": {"Files": [
        {"Path": SMALL_FILE, "Type": "blob", "Size": 5, "Sha256": small_file[1]}]}}  # fmt: skip
    hub.faults.listing_encoded = ("gzip", gzip.compress(json.dumps(listing).encode()))
    listed = ModelScope(hub.url).describe(SMALL_REPO, "master", SMALL_FILE)
    assert (listed.size, listed.sha256) == (5, small_file[1])
