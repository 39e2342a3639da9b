"""The lock against a hostile or careless hub, over loopback with real GGUF headers: it can only improve the
catalog. A header past llama.cpp's ceilings, a listing that overstates its file, a trickle, or facts that would
break another profile: refused in one line, in bounded time and memory, and the lock file left byte-identical."""

from __future__ import annotations

import shutil
import time
import tracemalloc
from pathlib import Path

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.lock import HubUnreachable, lock_model
from gguf_serve.catalog.lookup import lock_and_commit, resolve_locks
from gguf_serve.local.hub.server import Faults, LocalScope
from tests.catalog.stand_in import FILE, REPO, ROOT

MIB = 1024 * 1024


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


def header_gguf(path: Path, **facts: int) -> Path:
    """A header-only qwen35 GGUF (no tensors) with these `<arch>.<key>` integers (dots as in the key)."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35")
    for key, value in facts.items():
        w.add_uint32(f"qwen35.{key.replace('__', '.')}", value)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


QWEN = dict(context_length=262144, embedding_length=5120, block_count=65, attention__head_count=24,
            attention__head_count_kv=4, attention__key_length=256, attention__value_length=256,
            full_attention_interval=4, nextn_predict_layers=1, ssm__conv_kernel=4, ssm__state_size=128,
            ssm__group_count=16, ssm__inner_size=6144, ssm__time_step_rank=48)  # fmt: skip


def test_a_block_count_past_llama_cpps_ceiling_is_refused_in_bounded_memory(tmp_path: Path) -> None:
    gguf = header_gguf(tmp_path / "huge.gguf", **{**QWEN, "block_count": 10**9})
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, gguf)
        tracemalloc.start()
        try:
            with pytest.raises(ProfileError) as refused:
                lock_model("Qwen3.6-27B", repo=REPO, file=FILE, endpoint=hub.url)
        finally:
            peak = tracemalloc.get_traced_memory()[1] / MIB
            tracemalloc.stop()
    print(f"block_count 10^9: refused with a peak of {peak:.1f} MiB")
    assert "block_count = 1,000,000,000 is more than llama.cpp loads (512)" in str(refused.value)
    assert peak < 64


def test_a_listing_that_overstates_its_file_is_not_locked(profiles: Path, tmp_path: Path) -> None:
    """A hub whose listing and Content-Range agree on a size the file does not have (it ends sooner)."""
    gguf = header_gguf(tmp_path / "ok.gguf", **QWEN)
    with gguf.open("r+b") as f:
        f.truncate(3 * MIB)  # past the header's first 1 MiB block: the lock reads the header, never these bytes
    claimed = gguf.stat().st_size + 4096
    lock = profiles / "models.lock.toml"
    before = lock.read_bytes()
    with LocalScope(faults=Faults(listed_sizes={FILE: claimed}, range_totals={FILE: claimed})) as hub:
        hub.add_file(REPO, FILE, gguf)
        with pytest.raises(ProfileError, match=f"lists {FILE} at {claimed:,} bytes but the file does not end there"):
            lock_and_commit("Qwen3.6-27B", root=profiles, lock_file=lock, endpoint=hub.url)
    assert lock.read_bytes() == before


def test_a_trickling_hub_ends_the_lock_by_its_deadline(tmp_path: Path) -> None:
    """One byte of the listing every 0.2 s: never slow enough for a read timeout; the lock's deadline ends it."""
    with LocalScope(faults=Faults(trickle_json_every_s=0.2)) as hub:
        hub.add_file(REPO, FILE, header_gguf(tmp_path / "ok.gguf", **QWEN))
        started = time.monotonic()
        with pytest.raises(HubUnreachable) as refused:
            lock_model("Qwen3.6-27B", repo=REPO, file=FILE, endpoint=hub.url, deadline_s=2.0)
        took = time.monotonic() - started
    print(f"trickling listing: the lock ended after {took:.1f} s (deadline 2 s)")
    assert "\n" not in str(refused.value) and hub.url in str(refused.value)
    assert took < 30


def test_facts_that_would_break_another_profile_refuse_the_model_and_write_nothing(profiles: Path, tmp_path: Path):
    """The 27B's listing gives a header whose KV cache no card of its profiles holds: locking it would leave
    every later synth and `check` failing. The lookup refuses the 27B's stacks instead; the file is unchanged."""
    huge_kv = header_gguf(tmp_path / "kv.gguf", **{**QWEN, "attention__head_count_kv": 64})
    lock = profiles / "models.lock.toml"
    before = lock.read_bytes()
    said: list[str] = []
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, huge_kv)
        done = resolve_locks(["Qwen3.6-27B"], root=profiles, lock_file=lock, endpoint=hub.url, say=said.append)
    assert lock.read_bytes() == before and done.locked == {}
    why = done.refused["Qwen3.6-27B"]
    assert "the listing's facts for Qwen3.6-27B would break" in why and "gpu-mtp.toml" in why, why
    assert f"{lock} is left as it was" in why
