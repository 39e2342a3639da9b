"""Names that would carry shell syntax to an instance, and ports that cannot work there, refused where the catalog is
read (`gguf-serve-catalog check`, synth) with file, key and what to write instead: a repo or file of the hub's
characters, a profile named like one, the hop's port 1024 or above and not llama-server's own behind it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.loader import load_catalog
from gguf_serve.catalog.lockfile import parse_lock
from tests.catalog.stand_in import ROOT
from tests.catalog.test_profile_files import edit

REPO_27B = 'repo = "unsloth/Qwen3.6-27B-MTP-GGUF"'
FILE_27B = 'file = "Qwen3.6-27B-Q4_K_M.gguf"'
GRAVITON = "serving/graviton-moe.toml"


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


@pytest.mark.parametrize(
    ("file", "old", "new", "says"),
    [
        ("models.toml", REPO_27B, 'repo = "unsloth/Qwen$(touch /tmp/pwned)"', r"\.repo: .* allowed: owner/name"),
        ("models.toml", REPO_27B, 'repo = "unsloth/`id`"', r"\.repo: .* allowed: owner/name"),
        ("models.toml", REPO_27B, 'repo = "unsloth/a\\"; reboot; \\"b"', r"\.repo: .* allowed: owner/name"),
        ("models.toml", REPO_27B, 'repo = "unsloth/a\\nreboot"', r"\.repo: .* allowed: owner/name"),
        ("models.toml", REPO_27B, 'repo = "-rf/x"', r"\.repo: .* allowed: owner/name"),
        ("models.toml", FILE_27B, 'file = "Q4.gguf$(reboot)"', r"\.file: .* allowed: a path in the repo"),
        ("models.toml", FILE_27B, 'file = "dir/../Q4.gguf"', r"\.file: .* allowed: a path in the repo"),
        ("models.toml", FILE_27B, 'file = "Q4 K.gguf"', r"\.file: .* allowed: a path in the repo"),
        ("models.toml", FILE_27B, 'file = "%n.gguf"', r"\.file: .* allowed: a path in the repo"),  # systemd specifier
        ("models.toml", '["Qwen3.6-27B"]', '["Qwen$(reboot)"]', r"model name .* is not allowed"),
        (GRAVITON, "[server]", "[server]\nport = 22", r"server\.port: 22 is below the range; allowed: 1,024"),
        (GRAVITON, "[server]", "[server]\nport = 80", r"server\.port: 80 is below the range; allowed: 1,024"),
        (GRAVITON, "[server]", "[server]\nport = 8081", r"server\.port: 8081 is llama-server's port behind the hop"),
    ],
    ids=[
        "dollar-paren",
        "backtick",
        "quote",
        "newline",
        "dash",
        "file-dollar",
        "file-dotdot",
        "file-space",
        "file-percent",
        "model-name",
        "port-22",
        "port-80",
        "port-upstream",
    ],  # fmt: skip
)
def test_a_name_or_port_that_cannot_reach_an_instance_is_refused(profiles: Path, file, old, new, says) -> None:
    edit(profiles / file, old, new)
    with pytest.raises(ProfileError, match=says):
        load_catalog(profiles)


@pytest.mark.parametrize("stem", ["graviton$(reboot)", "graviton\nmoe", "graviton moe", ".graviton"])
def test_a_profile_named_with_shell_syntax_is_refused_by_check(profiles: Path, stem: str) -> None:
    """The profile's name is its file's name; `check` says which file to rename, in one line."""
    (profiles / GRAVITON).rename(profiles / "serving" / f"{stem}.toml")
    out = subprocess.run([sys.executable, "-m", "gguf_serve.catalog", "--profiles", str(profiles), "check"],
                         capture_output=True, text=True, cwd=ROOT, timeout=60)  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert "is not allowed; rename the file" in out.stderr, out.stderr
    assert out.stderr.strip().count("\n") <= 1  # the name itself may hold the newline, quoted as \n: one line


def test_a_lock_entry_with_shell_syntax_is_refused(profiles: Path) -> None:
    lock = profiles / "models.lock.toml"
    text = lock.read_text().replace(REPO_27B, 'repo = "unsloth/$(reboot)"', 1)
    with pytest.raises(ProfileError, match=r'"Qwen3.6-27B".repo: .* is not allowed; allowed: owner/name'):
        parse_lock(text, lock)


@pytest.mark.parametrize("count", ["block_count = 1000000000", "expert_count = 100000"])
def test_a_lock_entry_past_llama_cpps_ceilings_is_refused(profiles: Path, count: str) -> None:
    lock = profiles / "models.lock.toml"
    key = count.split(" = ")[0]
    text = lock.read_text()
    start = text.index('["Qwen3.6-35B-A3B".gguf]')
    line_start = text.index(f"\n{key} = ", start) + 1
    line_end = text.index("\n", line_start)
    with pytest.raises(ProfileError, match=rf"{key} = [\d,]+ is more than llama.cpp loads"):
        parse_lock(text[:line_start] + count + text[line_end:], lock)


def test_synth_sends_a_hostile_repo_to_no_hub_and_refuses_its_stacks(profiles: Path) -> None:
    """The lookup synth runs for an unlocked model: the name is refused before any request is made."""
    from gguf_serve.catalog.lookup import resolve_locks

    edit(profiles / "models.toml", REPO_27B, 'repo = "unsloth/$(reboot)"')
    lock = profiles / "models.lock.toml"
    before = lock.read_bytes()
    done = resolve_locks(["Qwen3.6-27B"], root=profiles, lock_file=lock, endpoint="http://127.0.0.1:9")
    assert "repo: 'unsloth/$(reboot)' is not allowed" in done.refused["Qwen3.6-27B"]
    assert "unreachable" not in done.refused["Qwen3.6-27B"] and lock.read_bytes() == before
