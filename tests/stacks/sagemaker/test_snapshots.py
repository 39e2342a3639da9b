"""One scrubbed snapshot per SageMaker stack, as for the EC2 stacks (tests/stacks/test_snapshots.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from syrupy.extensions.json import JSONSnapshotExtension

from tests.stacks.conftest import scrub
from tests.stacks.sagemaker.test_stacks import SAGEMAKER_STACKS as TWINS
from tests.stacks.test_snapshots import MAX_LINES

SAGEMAKER_STACKS = [*TWINS, "C5MoeSageMakerStack", "G4dnMoeSageMakerStack"]  # and the endpoint profiles'


@pytest.fixture
def snapshot_json(snapshot):
    return snapshot.use_extension(JSONSnapshotExtension)


@pytest.mark.parametrize("stack", SAGEMAKER_STACKS)
def test_snapshot(assembly, stack, snapshot_json):
    assert scrub(assembly.get_stack_by_name(stack).template) == snapshot_json


def test_each_snapshot_stays_readable():
    files = sorted((Path(__file__).parent / "__snapshots__" / "test_snapshots").glob("*.json"))
    assert len(files) == len(SAGEMAKER_STACKS), "one snapshot per stack: run with --snapshot-update"
    for path in files:
        assert len(path.read_text().splitlines()) <= MAX_LINES, path.name
