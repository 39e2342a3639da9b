"""`make synth` as a newcomer runs it on a clean clone with no route to ModelScope: it synthesizes every stack `cdk
deploy` would take and names each one it would refuse, one line each, and exits 0 (it exited 2 when the typed 35B
stacks were listed as deployable and then refused). Through make, the module and the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.cli, pytest.mark.slow]
DOWN = "http://127.0.0.1:9"  # nothing listens: the lookup fails at once, as offline


def _make_synth(tmp_path: Path, *context: str) -> subprocess.CompletedProcess:
    lock = tmp_path / "models.lock.toml"
    shutil.copyfile(ROOT / "profiles" / "models.lock.toml", lock)  # the committed lock, never written here
    args = " ".join(["-c", f"modelLock={lock}", *context])
    env = {**os.environ, "MODELSCOPE_ENDPOINT": DOWN}
    return subprocess.run(
        ["make", "-s", "synth", f"SYNTH_ARGS={args}", f"SYNTH_OUT={tmp_path / 'out'}"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip


def _refused(out: subprocess.CompletedProcess) -> dict[str, str]:
    lines = [line.removeprefix("refused: ") for line in out.stderr.splitlines() if line.startswith("refused: ")]
    return dict(line.split(": ", 1) for line in lines)


def test_offline_with_the_committed_lock_every_stack_is_named_with_why_and_make_exits_0(tmp_path):
    out = _make_synth(tmp_path)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    refused = _refused(out)
    assert {"GravitonMoeStack", "IntelMoeStack", "GpuMtpStack", "C5MoeSageMakerStack"} <= set(refused)
    assert "127.0.0.1:9 is unreachable" in refused["GpuMtpStack"]  # the 27B has no sha256 to deploy
    assert "allowTypedLock=true" in refused["GravitonMoeStack"]  # the 35B's is typed, not checked
    assert "no stack is deployable yet" in out.stdout and not (tmp_path / "out").exists()


def test_offline_with_typed_locks_allowed_the_deployable_stacks_synthesize_and_the_unhosted_are_named(tmp_path):
    out = _make_synth(tmp_path, "-c", "allowTypedLock=true")
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    refused = _refused(out)
    assert "ml.c8g.4xlarge is not hosted in cn-northwest-1" in refused["GravitonMoeSageMakerStack"]
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    stacks = {k: v for k, v in manifest["artifacts"].items() if v["type"] == "aws:cloudformation:stack"}
    deployable = {"GravitonMoeStack", "IntelMoeStack", "C5MoeSageMakerStack", "G4dnMoeSageMakerStack"}
    assert deployable <= set(stacks) and not deployable & set(refused)

    def errors(name: str) -> list[str]:  # what `cdk deploy --app <out> <name>` refuses on
        metadata = json.loads((tmp_path / "out" / stacks[name]["additionalMetadataFile"]).read_text())
        return [e["data"] for entries in metadata.values() for e in entries if e["type"] == "aws:cdk:error"]

    assert all(errors(name) for name in refused) and not any(errors(name) for name in deployable)
