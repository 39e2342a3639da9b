"""A stack whose model has no pinned sha256 is refused by the real CLI; the other stacks still synth and deploy.

The app synthesizes every stack, so a plain exception would break `cdk deploy GravitonMoeStack` too. Instead the
unpinned stack carries an error annotation (stacks/app.py), and the pinned CDK CLI refuses only a selected
stack with errors. This is the evidence, with `npx cdk` exactly as users run it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from stacks.app import build_app, cli_context
from tests.catalog.stand_in import stand_in_lock
from tests.stacks.test_deploy_options import TestTheRealCli

REFUSAL = "GpuMtpStack: model Qwen3.6-27B (unsloth/Qwen3.6-27B-MTP-GGUF/Qwen3.6-27B-Q4_K_M.gguf) has no pinned sha256"
WHAT_TO_RUN = "run `python -m catalog lock Qwen3.6-27B` with access to ModelScope"


def _errors(app, stack: str) -> list[str]:
    return [str(m.data) for m in app.node.find_child(stack).node.metadata if m.type == "aws:cdk:error"]


def test_only_the_unpinned_stack_carries_an_error():
    app = build_app(cli_context())  # the committed lock, not the tests' pinned stand-in
    (error,) = _errors(app, "GpuMtpStack")
    assert REFUSAL in error and WHAT_TO_RUN in error
    for stack in ("GravitonMoeStack", "IntelMoeStack", "GravitonMoeHeadroomStack"):
        assert _errors(app, stack) == []
    with pytest.raises(RuntimeError, match="GpuMtpStack: model Qwen3.6-27B .* has no pinned sha256"):
        app.synth()  # in one process cdk-nag's policy validation reports it for the whole app


class TestTheRealCliRefusesOnlyTheUnpinnedStack(TestTheRealCli):
    def test_synth_selects(self, tmp_path: Path):
        ok = self._cdk(tmp_path, "synth", "GravitonMoeStack", "--quiet", "-o", str(tmp_path / "a"))
        assert ok.returncode == 0, ok.stdout[-2000:] + ok.stderr[-2000:]
        refused = self._cdk(tmp_path, "synth", "GpuMtpStack", "--quiet", "-o", str(tmp_path / "b"))
        assert refused.returncode != 0
        assert REFUSAL in refused.stdout + refused.stderr and WHAT_TO_RUN in refused.stdout + refused.stderr
        lock = stand_in_lock(tmp_path)  # the 27B pinned by the real lock step (test data): now it synthesizes
        args = ("synth", "GpuMtpStack", "-c", f"modelLock={lock}", "--quiet", "-o", str(tmp_path / "c"))
        pinned = self._cdk(tmp_path, *args)
        assert pinned.returncode == 0, pinned.stdout[-2000:] + pinned.stderr[-2000:]
