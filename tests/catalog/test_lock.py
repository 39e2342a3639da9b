"""The lock step against localscope over real loopback sockets, with real GGUF files: a few MB read, never the file."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from catalog import model_facts
from catalog.lock import lock_model
from catalog.lockfile import read_lock
from catalog.profiles import build_profile
from catalog.server import ServerSettings, Speculative
from localscope.server import LocalScope
from tests.catalog.stand_in import ROOT

MIB = 1024 * 1024
GEMMA_REPO, GEMMA_FILE = "local/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf"


def lock_command(profiles: Path, target: str, endpoint: str) -> subprocess.CompletedProcess:
    """`python -m catalog lock` as a user runs it, on a copy of the profile folder."""
    cmd = [sys.executable, "-m", "catalog", "--profiles", str(profiles), "lock", target, "--endpoint", endpoint]
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
    assert entry.header_bytes_read == served <= 8 * MIB
    assert served < 0.04 * gemma_gguf.stat().st_size
    assert model_facts.kv_bytes_per_token(entry.header) == 2 * 18 * 1 * 256 * 2
    assert "kv cache 18,432 bytes/token" in out.stdout and "MTP layers 0" in out.stdout


def test_lock_reads_mtp_layers_and_hybrid_state_from_a_qwen35_header(tmp_path: Path):
    from rehearsal import tiny_mtp

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
