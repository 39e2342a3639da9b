"""docker/pick-mirror.sh against local mirrors made from Debian's real signed release (tests/mirrors.py): the first
mirror whose InRelease verifies against the pinned keyring and whose package index matches it wins, and the log
says which and how fast."""

from __future__ import annotations

import os
import subprocess

from tests import mirrors
from tests.conftest import ROOT
from tests.mirrors import INDEX
from tests.mirrors import mirror as _mirror

SCRIPT = ROOT / "docker" / "pick-mirror.sh"
release, served = mirrors.release, mirrors.served  # the fixtures


def _pick(*mirrors: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_MIRRORS": " ".join(mirrors), "MIRROR_CONNECT_TIMEOUT_S": "5"}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_the_first_mirror_that_answers_and_verifies_wins_and_the_log_says_why(served, release):
    root, url = served
    kinds = [("empty", "empty"), ("forged", "signature"), ("syncing", "mid-sync"), ("good", None), ("later", None)]
    names = [_mirror(root, name, release, damage) for name, damage in kinds]
    out = _pick("http://127.0.0.1:9/debian", *(f"{url}/{n}" for n in names))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{url}/good"  # not "later": the list's order decides
    lines = out.stderr.splitlines()
    assert "http://127.0.0.1:9/debian: no answer for dists/trixie/InRelease" in lines[0]
    assert f"{url}/empty: no answer" in lines[1]
    assert f"{url}/forged: dists/trixie/InRelease is not signed by the pinned keyring" in lines[2]
    assert f"{url}/syncing: {INDEX} does not match its signed release" in lines[3]
    assert lines[4].startswith(f"pick-mirror: {url}/good: release signed, {INDEX} ") and "MB/s): using it" in lines[4]
    assert len(lines) == 5


def test_no_mirror_that_verifies_fails_with_what_to_change(served, release):
    root, url = served
    out = _pick(f"{url}/{_mirror(root, 'forged', release, 'signature')}")
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines()[-1].endswith("set debianMirrors to one the builder reaches")
