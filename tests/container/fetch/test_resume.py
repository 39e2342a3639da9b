"""Kill the CLI mid-download, run it again: it keeps what was synced and fetches only the rest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from gguf_serve.container.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB, partial_path, state_path
from gguf_serve.local.hub import LocalScope
from tests.committed import GEMMA3_270M
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import sha256_of

ROOT = Path(__file__).resolve().parents[3]
PART = 8 * MIB


def _cli(hub: LocalScope, dest: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [
            sys.executable, "-m", "gguf_serve.container.fetch", "--repo", GEMMA3_270M.repo, "--file", GEMMA3_270M.file,
            "--sha256", str(GEMMA3_270M.sha256), "--size", str(GEMMA3_270M.size_bytes), "--dest", str(dest),
            "--endpoint", hub.url, "--connections", "4", "--part-size-mib", str(PART // MIB),
        ],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip


def _quiesce(hub: LocalScope) -> None:
    last = -1
    while hub.stats.bytes_sent != last:
        last = hub.stats.bytes_sent
        time.sleep(0.3)


def _range_start(r: dict) -> int:
    return int(r["range"].split("=")[1].split("-")[0])


def test_resume_after_kill_does_not_download_completed_parts(gemma_hub: LocalScope, tmp_path: Path) -> None:
    size = GEMMA3_270M.size_bytes
    gemma_hub.faults.bandwidth_bps = 12e6  # 4 connections x 12 MB/s: about 5 s for the whole file
    dest = tmp_path / "models"
    target = dest / GEMMA3_270M.file

    first = _cli(gemma_hub, dest)
    deadline = time.monotonic() + 60
    while gemma_hub.stats.bytes_sent < 0.6 * size:
        assert first.poll() is None, first.stderr.read() if first.stderr else ""
        assert time.monotonic() < deadline
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    first.wait(timeout=10)
    _quiesce(gemma_hub)  # the server notices the dead client within a chunk or two
    first_bytes = gemma_hub.stats.bytes_sent

    assert not target.exists()
    assert partial_path(target).stat().st_size <= size  # nothing reserved ahead of the bytes that arrived
    saved = json.loads(state_path(target).read_text())
    kept = sum(saved["written"].values())
    complete = {int(i) for i, n in saved["written"].items() if n == PART}
    assert kept >= 0.3 * size and len(complete) >= 8  # synced at least once a second before the kill

    gemma_hub.stats.reset()
    gemma_hub.faults.bandwidth_bps = None
    second = _cli(gemma_hub, dest)
    out, err = second.communicate(timeout=120)
    assert second.returncode == 0, err[-3000:]
    summary = json.loads(out.strip().splitlines()[-1])
    assert summary["resumed"] == kept and summary["transferred"] == size - kept
    # Only the missing bytes went over the wire again, plus, where a loaded machine made the fetcher split a slow
    # range's tail across idle connections (ranged.py), the bytes in flight on the old owner's stream at each split.
    wasted = gemma_hub.stats.bytes_sent - (size - kept)
    assert 0 <= wasted <= summary["splits"] * PART, (wasted, summary["splits"])
    assert summary["splits"] or wasted == 0
    refetched = {_range_start(r) // PART for r in gemma_hub.stats.downloads()}
    assert refetched.isdisjoint(complete)
    assert first_bytes + gemma_hub.stats.bytes_sent < 1.3 * size
    assert sha256_of(target) == GEMMA3_270M.sha256
    assert not partial_path(target).exists() and not state_path(target).exists()


def test_state_for_another_file_is_discarded(hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    _, sha = small_file
    target = tmp_path / SMALL_FILE
    partial_path(target).write_bytes(b"\0" * small_file[0].stat().st_size)
    state_path(target).write_text(
        json.dumps({"format": 1, "size": small_file[0].stat().st_size, "sha256": "f" * 64, "part_size": MIB,
                    "written": {"0": MIB, "1": MIB}})
    )  # fmt: skip
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE, sha256=sha), tmp_path, endpoint=hub.url, part_size=MIB,
                   progress=False)  # fmt: skip
    assert r.resumed == 0 and r.transferred == small_file[0].stat().st_size
    assert sha256_of(target) == sha


def test_sigterm_saves_progress(gemma_hub: LocalScope, tmp_path: Path) -> None:
    gemma_hub.faults.bandwidth_bps = 12e6
    dest = tmp_path / "models"
    proc = _cli(gemma_hub, dest)
    deadline = time.monotonic() + 60
    while gemma_hub.stats.bytes_sent < 0.25 * GEMMA3_270M.size_bytes:
        assert proc.poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130 and "run the same command again to resume" in err
    saved = json.loads(state_path(dest / GEMMA3_270M.file).read_text())
    # Saved on the way out, not just at the last one-second tick: close to what was served.
    assert sum(saved["written"].values()) >= gemma_hub.stats.bytes_sent - 4 * 2 * MIB


def test_after_a_reboot_only_synced_progress_is_kept(
    hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path
) -> None:
    path, sha = small_file
    data = path.read_bytes()
    target = tmp_path / SMALL_FILE
    partial = bytearray(len(data))
    partial[: 3 * MIB] = data[: 3 * MIB]
    partial[MIB : 3 * MIB] = b"\0" * (2 * MIB)  # "written" before the reboot but never reached the disk
    partial_path(target).write_bytes(bytes(partial))
    state_path(target).write_text(
        json.dumps({"format": 1, "size": len(data), "sha256": sha, "part_size": MIB, "boot_id": "an-earlier-boot",
                    "written": {"0": MIB, "1": MIB, "2": MIB}, "synced": {"0": MIB}})
    )  # fmt: skip
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE, sha256=sha), tmp_path, endpoint=hub.url, part_size=MIB,
                   progress=False)  # fmt: skip
    assert (r.resumed, r.transferred) == (MIB, len(data) - MIB)
    assert sha256_of(target) == sha
