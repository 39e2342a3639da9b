"""The lock step against the local hub over real loopback sockets, with real GGUF files: a few MB read, not the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog import model_facts
from gguf_serve.catalog.lock import lock_model
from gguf_serve.catalog.lockfile import read_lock
from gguf_serve.container.server import ServerSettings, Speculative
from gguf_serve.local.hub.server import LocalScope
from tests.catalog.stand_in import ROOT
from tests.committed import build_profile

MIB = 1024 * 1024
GEMMA_REPO, GEMMA_FILE = "local/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf"


def lock_command(profiles: Path, target: str, endpoint: str) -> subprocess.CompletedProcess:
    """`gguf-serve-catalog lock` as a user runs it, on a copy of the profile folder."""
    cmd = [
        sys.executable,
        "-m",
        "gguf_serve.catalog",
        "--profiles",
        str(profiles),
        "lock",
        target,
        "--endpoint",
        endpoint,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=120)


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    """A copy of the committed profile folder the command may rewrite."""
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


def test_lock_command_pins_gemma_from_listing_and_ranged_header(gemma_gguf: Path, profiles: Path):
    committed = read_lock(ROOT / "profiles" / "models.lock.toml")["Gemma-3-270M"]
    with LocalScope() as hub:
        hub.add_file(GEMMA_REPO, GEMMA_FILE, gemma_gguf)
        out = lock_command(profiles, "Gemma-3-270M", hub.url)
        served = sum(r.get("sent", 0) for r in hub.stats.downloads())
    assert out.returncode == 0, out.stderr
    entry = read_lock(profiles / "models.lock.toml")["Gemma-3-270M"]
    assert entry.locked_from == "listing" and entry.endpoint == hub.url
    assert (entry.size_bytes, entry.sha256) == (gemma_gguf.stat().st_size, committed.sha256)
    assert entry.header == committed.header and entry.header["architecture"] == "gemma3"
    # A few MB of a 253 MB file: the header's 262k-token vocabulary, in 1 MiB blocks, never the tensors.
    assert entry.header_bytes_read + 1 == served <= 8 * MIB  # and the last byte: the file ends where listed
    assert served < 0.04 * gemma_gguf.stat().st_size
    assert model_facts.kv_bytes_per_token(entry.header) == 2 * 18 * 1 * 256 * 2
    assert "kv cache 18,432 bytes/token" in out.stdout and "MTP layers 0" in out.stdout


def test_lock_reads_mtp_layers_and_hybrid_state_from_a_qwen35_header(tmp_path: Path):
    from tests.rehearsal import tiny_mtp

    gguf = tiny_mtp.write(tmp_path / "tiny.gguf")
    with LocalScope() as hub:
        hub.add_file("local/tiny", "tiny.gguf", gguf)
        result = lock_model("tiny", repo="local/tiny", file="tiny.gguf", endpoint=hub.url)
    facts = result.entry.header
    assert facts["architecture"] == "qwen35" and model_facts.mtp_layers(facts) == 1
    assert facts["full_attention_interval"] == 4 and facts["block_count"] == 5
    assert model_facts.recurrent_layers(facts) == [0, 1, 2]  # layer 3 attends; layer 4 is the MTP head
    assert model_facts.kv_bytes_per_token(facts) == 1 * (tiny_mtp.N_HEAD_KV * tiny_mtp.HEAD_DIM * 2) * 2
    state, inner = tiny_mtp.SSM_STATE, tiny_mtp.SSM_STATE * tiny_mtp.SSM_V_HEADS
    conv = (tiny_mtp.SSM_CONV - 1) * (inner + 2 * tiny_mtp.SSM_GROUPS * state)
    ssm = state * inner
    assert model_facts.recurrent_state_bytes(facts) == 3 * (conv + ssm) * 4
    assert result.bytes_read <= gguf.stat().st_size


def test_typed_qwen_facts_give_the_catalogs_earlier_numbers():
    locks = read_lock(ROOT / "profiles" / "models.lock.toml")
    moe, dense = locks["Qwen3.6-35B-A3B"].header, locks["Qwen3.6-27B"].header
    assert model_facts.kv_bytes_per_token(moe) == 2 * 10 * 2 * 256 * 2
    assert model_facts.kv_bytes_per_token(dense) == 2 * 16 * 4 * 256 * 2
    assert round(model_facts.recurrent_state_bytes(moe) / MIB) == 63
    assert round(model_facts.recurrent_state_bytes(dense) / MIB) == 150
    assert locks["Qwen3.6-35B-A3B"].sha256 == "0b21525e972670ed59e1812e170b27c26355381f0656ecc4e25617ece7dac58b"
    assert locks["Qwen3.6-35B-A3B"].size_bytes == 22_663_387_424
    assert locks["Qwen3.6-27B"].sha256 is None and locks["Qwen3.6-27B"].locked_from == "typed"


def test_mtp_refusal_is_computed_from_the_locked_header():
    with pytest.raises(Exception, match=r"has no MTP layers \(gemma3\.nextn_predict_layers is 0\)"):
        build_profile(
            name="x", stack_name="X", instance_type="c8g.4xlarge", model="Gemma-3-270M",
            server=ServerSettings(parallel=1, speculative=Speculative()), image="arm64-cpu",
        )  # fmt: skip


def test_a_file_missing_from_the_listing_says_what_the_repo_has(gemma_gguf: Path, profiles: Path):
    with LocalScope() as hub:
        hub.add_file(GEMMA_REPO, "other.gguf", gemma_gguf)
        out = lock_command(profiles, "Gemma-3-270M", hub.url)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "gemma-3-270m-q4_k_m.gguf is not in ModelScope repo" in out.stderr and "other.gguf" in out.stderr


def _headless_gguf(path: Path, keys: int = 2000) -> Path:
    """A valid GGUF whose header has an architecture and many keys but no block_count: nothing to plan from."""
    import gguf

    w = gguf.GGUFWriter(str(path), "qwen35")
    for i in range(keys):
        w.add_uint32(f"filler.{i}", i)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def _tiny_mtp(tmp_path: Path) -> Path:
    from tests.rehearsal import tiny_mtp

    return tiny_mtp.write(tmp_path / "tiny.gguf")


TINY_REPO, TINY_FILE = "unsloth/Qwen3.6-27B-MTP-GGUF", "Qwen3.6-27B-Q4_K_M.gguf"  # the 27B's place


@pytest.mark.slow  # writing and reading 600,000 keys: about 20 s here
def test_a_failed_lock_writes_nothing(profiles: Path, tmp_path: Path):
    """The issue's file: a valid GGUF with 600,000 keys and no block_count. The command fails in one line and the
    lock file is byte-identical."""
    before = (profiles / "models.lock.toml").read_bytes()
    with LocalScope() as hub:
        hub.add_file(TINY_REPO, TINY_FILE, _headless_gguf(tmp_path / "headless.gguf", keys=600_000))
        out = lock_command(profiles, "Qwen3.6-27B", hub.url)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.count("\n") == 1 and "block_count" in out.stderr, out.stderr
    assert (profiles / "models.lock.toml").read_bytes() == before
    assert not [p.name for p in profiles.iterdir() if p.name.endswith(".tmp")]


def test_a_size_no_volume_can_hold_is_refused_at_lock_time(profiles: Path, tmp_path: Path):
    from gguf_serve.local.hub.server import Faults

    before = (profiles / "models.lock.toml").read_bytes()
    with LocalScope(faults=Faults(listed_sizes={TINY_FILE: 2**60})) as hub:
        hub.add_file(TINY_REPO, TINY_FILE, _tiny_mtp(tmp_path))
        out = lock_command(profiles, "Qwen3.6-27B", hub.url)
        downloads = hub.stats.downloads()
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "1,152,921,504,606,846,976 bytes, more than any volume the catalog can plan" in out.stderr
    assert downloads == [] and (profiles / "models.lock.toml").read_bytes() == before


def test_a_trickling_hub_ends_the_lock_in_one_line(tmp_path: Path):
    from gguf_serve.catalog.lock import HubUnreachable
    from gguf_serve.container.fetch.pace import RatePolicy
    from gguf_serve.local.hub.server import Faults

    rate = RatePolicy(min_bps=64 * 1024, window_s=1.0, idle_s=5.0, headers_s=5.0)  # the default window is 30 s
    with LocalScope(faults=Faults(trickle_every_s=0.01)) as hub:
        hub.add_file(TINY_REPO, TINY_FILE, _tiny_mtp(tmp_path))
        with pytest.raises(HubUnreachable) as refused:
            lock_model("Qwen3.6-27B", repo=TINY_REPO, file=TINY_FILE, endpoint=hub.url, rate=rate)
    message = str(refused.value)
    assert "\n" not in message and "below the minimum" in message and hub.url in message


def test_the_lock_records_the_host_that_served_the_bytes(tmp_path: Path):
    """The hub answers the download with a 302 to storage on another host, as ModelScope does."""
    from gguf_serve.local.hub.server import Faults

    gguf = _tiny_mtp(tmp_path)
    with LocalScope() as storage, LocalScope(faults=Faults(redirect_to=None)) as hub:
        storage.add_file(TINY_REPO, TINY_FILE, gguf)
        hub.add_file(TINY_REPO, TINY_FILE, gguf)
        hub.faults.redirect_to = storage.url.replace("127.0.0.1", "localhost")
        entry = lock_model("Qwen3.6-27B", repo=TINY_REPO, file=TINY_FILE, endpoint=hub.url).entry
        served = sum(r.get("sent", 0) for r in storage.stats.downloads())
    assert entry.endpoint == hub.url and entry.served_by == storage.url.replace("http://127.0.0.1", "localhost")
    assert served == entry.header_bytes_read + 1 and served > 1 and not hub.stats.downloads()  # + the last byte


def test_a_redirect_to_a_host_that_is_down_ends_in_one_line(tmp_path: Path):
    from gguf_serve.catalog.lock import HubUnreachable
    from gguf_serve.local.hub.server import Faults

    with LocalScope(faults=Faults(redirect_to="http://127.0.0.1:9")) as hub:
        hub.add_file(TINY_REPO, TINY_FILE, _tiny_mtp(tmp_path))
        with pytest.raises(HubUnreachable) as refused:
            lock_model("Qwen3.6-27B", repo=TINY_REPO, file=TINY_FILE, endpoint=hub.url)
    message = str(refused.value)
    assert "\n" not in message and "is unreachable" in message and "Connection refused" in message
