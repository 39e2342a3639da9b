"""Fixtures for the boot rehearsal: the serving image the image tier builds, the stand-ins, the fake instances.

Opt-in (`make rehearse`, or `pytest -m tests.rehearsal`; pyproject.toml deselects the marker by default): it needs root,
a Docker engine (installed and started here when missing, as the image tier does) and about 5 minutes once the
images exist.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

REHEARSED_STACK = "IntelMoeStack"  # the stack whose image and user data the fake instances boot


def _stage_and_synth() -> Path:
    from stacks.app import build_app
    from tests.conftest import cdk_context

    subprocess.run(
        [str(ROOT / "scripts" / "stage-image-sources.sh")],
        check=True,
        capture_output=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    # What the CLI does (aws-cdk's synth sets this context): a refused stack (an error annotation, such as a
    # SageMaker type the region does not host) does not stop the others' synth; the CLI refuses the selected stack
    # only. The rehearsed stack must carry none, as `cdk deploy IntelMoeStack` requires.
    context = {**cdk_context(), "@aws-cdk/core:failSynthOnValidationErrors": False}
    directory = Path(build_app(context).synth().directory)
    report_file = directory / "validation-report.json"
    report = json.loads(report_file.read_text()) if report_file.exists() else {"pluginReports": []}
    refusals = [
        v["description"]
        for plugin in report["pluginReports"]
        for v in plugin["violations"]
        if any(c["constructPath"].split("/")[0] == REHEARSED_STACK for c in v.get("violatingConstructs", []))
    ]
    assert not refusals, f"`cdk deploy {REHEARSED_STACK}` would refuse: {refusals}"
    return directory


@pytest.fixture(scope="session")
def assembly() -> Path:
    """The cloud assembly `cdk synth` writes for this checkout."""
    return _stage_and_synth()


@pytest.fixture(scope="session")
def instance_role_actions(assembly: Path) -> set[str]:
    """The IAM actions IntelMoeStack's instance role is granted by its own policies (managed policies aside)."""
    import json

    resources = json.loads((assembly / "IntelMoeStack.template.json").read_text())["Resources"]
    (role,) = [
        name
        for name, r in resources.items()
        if r["Type"] == "AWS::IAM::Role"
        and "ec2.amazonaws.com" in _services(r["Properties"]["AssumeRolePolicyDocument"]["Statement"][0])
    ]
    actions: set[str] = set()
    for r in resources.values():
        if r["Type"] == "AWS::IAM::Policy" and {"Ref": role} in r["Properties"]["Roles"]:
            for statement in r["Properties"]["PolicyDocument"]["Statement"]:
                if statement["Effect"] == "Allow":
                    action = statement["Action"]
                    actions.update([action] if isinstance(action, str) else action)
    return actions


@pytest.fixture(scope="session")
def serving_image(assembly: Path) -> str:
    """The x86-64 CPU image as the image tier builds it from the synthesized IntelMoeStack (reused when built)."""
    from tests.images.engine import docker, ensure_engine

    ensure_engine()
    if os.environ.get("GGUF_SERVE_REHEARSAL_IMAGE"):  # an image already built from this checkout
        return os.environ["GGUF_SERVE_REHEARSAL_IMAGE"]
    from tests.images.buildspec import build_inputs, run_buildspec

    inputs = build_inputs(assembly, "IntelMoeStack")
    if docker("image", "inspect", inputs.image, check=False).returncode != 0:
        work = Path(os.environ.get("TMPDIR", "/tmp")) / "gguf-serve-rehearsal-build"
        work.mkdir(parents=True, exist_ok=True)
        run_buildspec(inputs, work)
    return inputs.image


def _services(statement: dict) -> list[str]:
    """A trust statement's service principals (one name, or a list: in aws-cn the EC2 role trusts two)."""
    service = statement.get("Principal", {}).get("Service", [])
    return [service] if isinstance(service, str) else service
