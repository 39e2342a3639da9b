"""One scrubbed JSON snapshot per stack (syrupy's JSONSnapshotExtension): a template change reads as a diff of
that stack's file. Update with `pytest tests/stacks/test_snapshots.py --snapshot-update` and review the diff."""

from __future__ import annotations

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.stacks.conftest import STACK_NAMES, scrub

MAX_LINES = 6000  # a snapshot longer than this is no longer a diff a reviewer reads: split the stack


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_snapshot(templates, stack, snapshot_json):
    assert scrub(templates[stack].to_json()) == snapshot_json


def test_each_snapshot_stays_readable():
    from pathlib import Path

    folder = Path(__file__).parent / "__snapshots__" / "test_snapshots"
    files = sorted(folder.glob("*.json"))
    assert len(files) == len(STACK_NAMES), "one snapshot per stack: run with --snapshot-update"
    for path in files:
        assert len(path.read_text().splitlines()) <= MAX_LINES, path.name
