"""A stack refused for one model never stops the others, and a workstation profile never stops the CDK app: the app
builds from a profile folder where the 27B's lock entry no longer fits its profile and a workstation profile is
broken; GpuMtpStack carries the reason (an error annotation the CLI reports when that stack is selected), the other
stacks build clean."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

from gguf_serve.catalog.lockfile import read_lock, render_lock
from stacks.app import build_app
from tests.conftest import ROOT, cdk_context


def _errors(app, stack: str) -> list[str]:
    return [str(m.data) for m in app.node.find_child(stack).node.metadata if m.type == "aws:cdk:error"]


def _a_27b_no_a10g_holds(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of the profiles whose lock gives the 27B a KV cache no A10G holds: gpu-mtp no longer loads."""
    profiles = Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))
    lock = profiles / "models.lock.toml"
    entries = read_lock(lock)
    big = {**entries["Qwen3.6-27B"].header, "attention.head_count_kv": 64}  # a KV cache no A10G holds
    entries["Qwen3.6-27B"] = replace(entries["Qwen3.6-27B"], header=big, locked_from="listing", sha256="a" * 64)
    lock.write_text(render_lock(entries))
    return profiles, lock


def test_one_models_refusal_and_a_broken_workstation_profile_stop_nothing_else(tmp_path: Path) -> None:
    profiles, lock = _a_27b_no_a10g_holds(tmp_path)
    (profiles / "workstation" / "broken.toml").write_text('workstation = "no-such-card"\nmodel = "Qwen3.6-27B"\n')
    app = build_app({**cdk_context(), "modelLock": str(lock), "modelLookup": "false"}, profiles_dir=profiles,
                    config_file=tmp_path / "absent.toml", stack_names=["GpuMtpStack", "IntelMoeStack"])  # fmt: skip
    (error,) = _errors(app, "GpuMtpStack")
    assert error.startswith("GpuMtpStack: profile 'gpu-mtp': Qwen3.6-27B needs") and "A10G" in error, error
    assert _errors(app, "IntelMoeStack") == []
    assert app.node.find_child("IntelMoeStack").node.find_child("Fleet")  # built whole, not a placeholder


def test_a_sagemaker_twin_of_a_profile_that_does_not_load_says_why(tmp_path: Path) -> None:
    """The twin is built from the EC2 profile: when that profile fails, the twin's refusal is the profile's reason,
    not a missing lock entry (the model is locked)."""
    profiles, lock = _a_27b_no_a10g_holds(tmp_path)
    app = build_app({**cdk_context(), "modelLock": str(lock), "modelLookup": "false"}, profiles_dir=profiles,
                    config_file=tmp_path / "absent.toml", stack_names=["GpuMtpSageMakerStack"])  # fmt: skip
    (error,) = _errors(app, "GpuMtpSageMakerStack")
    assert error.startswith("GpuMtpSageMakerStack: its profile (the one GpuMtpStack deploys) does not load:"), error
    assert "Qwen3.6-27B needs" in error and "A10G" in error and "lock entry" not in error, error
