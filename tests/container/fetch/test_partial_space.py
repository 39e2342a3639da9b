"""A partial file holds what arrived, never the size a listing or a Content-Range claims (issue 21)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_serve.container.fetch.errors import FetchError
from gguf_serve.container.fetch.ranged import RangedDownload, partial_path
from gguf_serve.container.fetch.retry import RetryPolicy

CLAIMED = 40 * 1024 * 1024
SENT = 3 * 1000 * 1000


class ShortSource:
    """Claims CLAIMED bytes, sends the first SENT of them, then fails for good."""

    name = "short-source"

    def __init__(self) -> None:
        self.sent = 0

    def stream(self, start: int, end: int) -> Iterator[bytes]:
        while start < end and self.sent < SENT:
            n = min(65536, end - start, SENT - self.sent)
            self.sent += n
            start += n
            yield b"x" * n
        raise FetchError("the server stopped sending")


def test_a_short_body_leaves_a_partial_no_bigger_than_what_arrived(tmp_path: Path) -> None:
    target = tmp_path / "m.gguf"
    dl = RangedDownload(target, size=CLAIMED, sha256=hashlib.sha256(b"").hexdigest(), connections=1,
                        retry=RetryPolicy(attempts=0))  # fmt: skip
    with pytest.raises(FetchError):
        dl.run(ShortSource())
    st = os.stat(partial_path(target))
    assert st.st_size <= SENT, f"{st.st_size} bytes of apparent size for {SENT} received"
    assert st.st_blocks * 512 <= SENT + 1024 * 1024, f"{st.st_blocks * 512} bytes allocated for {SENT} received"
    assert dl.present_bytes() == SENT  # kept for a resume


@pytest.mark.parametrize(("dest", "exit_code"), [("", 2), (" ", 2), ("a-file", 1)])
def test_dest_must_be_a_directory(dest: str, exit_code: int, tmp_path: Path) -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[3]
    (tmp_path / "a-file").write_text("not a folder")
    p = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.fetch", "--repo", "a/b", "--file", "m.gguf", "--size", "1",
         "--sha256", "0" * 64, "--dest", dest, "--endpoint", "http://127.0.0.1:9"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(root)},
    )  # fmt: skip
    assert p.returncode == exit_code and "--dest" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert sorted(q.name for q in tmp_path.iterdir()) == ["a-file"]  # nothing written in the working directory
