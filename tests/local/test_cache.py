"""Cache entries appear whole or not at all, however many processes make them at once or die making them."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

# A maker that writes half, waits, writes the rest and counts its runs: a reader of a half-made entry would see "half".
MAKER = """
import sys, time
from pathlib import Path
from gguf_serve.local.cache import cached

root = Path(sys.argv[1])

def make(tmp):
    with open(root / "runs", "a") as f:
        f.write("run\\n")
    tmp.write_text("half")
    time.sleep(float(sys.argv[2]))
    tmp.write_text("whole")

print(cached(root / "entry", make).read_text(), flush=True)
"""


def _maker(root: Path, seconds: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", MAKER, str(root), str(seconds)], env=env, stdout=subprocess.PIPE,
                            text=True, start_new_session=True)  # fmt: skip


def test_two_processes_at_once_make_the_entry_once_and_both_read_it_whole(tmp_path):
    first, second = _maker(tmp_path, 1.0), _maker(tmp_path, 1.0)
    assert [p.communicate(timeout=30)[0].strip() for p in (first, second)] == ["whole", "whole"]
    assert (tmp_path / "runs").read_text() == "run\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == [".entry.lock", "entry", "runs"]


def test_a_killed_maker_leaves_nothing_that_looks_made_and_the_next_one_makes_it(tmp_path):
    killed = _maker(tmp_path, 30.0)
    deadline = time.monotonic() + 20
    while not list(tmp_path.glob(".entry.tmp-*")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(killed.pid, signal.SIGKILL)
    killed.wait(timeout=10)
    assert not (tmp_path / "entry").exists() and list(tmp_path.glob(".entry.tmp-*"))  # the temporary name only
    again = _maker(tmp_path, 0.0)
    assert again.communicate(timeout=30)[0].strip() == "whole"
    assert (tmp_path / "runs").read_text() == "run\nrun\n"
    assert not list(tmp_path.glob(".entry.tmp-*"))  # the next maker removed the dead one's


def test_an_entry_the_producer_no_longer_accepts_is_made_again(tmp_path):
    from gguf_serve.local.cache import cached

    (tmp_path / "entry").write_text("old layout")
    path = cached(tmp_path / "entry", lambda tmp: tmp.write_text("new"), valid=lambda p: p.read_text() == "new")
    assert path.read_text() == "new"
