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
release, served, hostile = mirrors.release, mirrors.served, mirrors.hostile  # the fixtures


def _pick(*mirrors: str, **bounds: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "DEBIAN_MIRRORS": " ".join(mirrors), "MIRROR_CONNECT_TIMEOUT_S": "5", **bounds}
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


def test_a_mirror_that_trickles_or_never_ends_loses_its_turn_to_the_next(served, release, hostile):
    """A byte every half second never trips wget's read timeout, and an endless answer would fill the disk: both
    are cut at their bound (time, size) and the next mirror is asked."""
    root, url = served
    good = _mirror(root, "good", release)
    out = _pick(f"{hostile}/trickle", f"{hostile}/endless", f"{url}/{good}",
                MIRROR_RELEASE_TIMEOUT_S="3", MIRROR_RELEASE_MAX_BYTES="200000")  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"{url}/{good}"
    lines = out.stderr.splitlines()
    assert lines[0] == f"pick-mirror: {hostile}/trickle: dists/trixie/InRelease took longer than 3 s: next mirror"
    assert lines[1] == (f"pick-mirror: {hostile}/endless: dists/trixie/InRelease is larger than 200000 bytes "
                        "(stopped there): next mirror")  # fmt: skip
    assert "using it" in lines[2] and len(lines) == 3


def test_an_index_that_outgrows_the_size_its_release_names_is_cut_there(served, release):
    """The index is bounded by the size its signed release names: a mirror that appends to it is stopped one byte
    past it."""
    root, url = served
    name = _mirror(root, "grown", release)
    index = root / name / "dists" / "trixie" / INDEX
    index.write_bytes(index.read_bytes() + b"\0" * 4096)
    out = _pick(f"{url}/{name}")
    assert out.returncode == 1
    assert f"{url}/{name}: dists/trixie/{INDEX} is larger than " in out.stderr
