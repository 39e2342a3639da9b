"""SharedEndpointStack synthesized once, through build_app (cdk-nag on, as `cdk synth` runs it), with three EC2 stacks
behind it: the Graviton and Intel ones serve the same 35B-A3B names (balanced over both), the GPU one the 27B; the
callers limited and HTTPS, as a team's endpoint would be."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from stacks.app import build_app
from stacks.shared_endpoint import STACK_NAME
from tests.conftest import cdk_context
from tests.whole_app import CERT

MEMBERS = ("GravitonMoeStack", "GpuMtpStack", "IntelMoeStack")
CONTEXT = {"sharedEndpoint": ",".join(MEMBERS), "allowedCidrs": "10.8.0.0/16", "certificateArn": CERT}


@pytest.fixture(scope="session")
def shared_assembly(tmp_path_factory) -> Path:
    app = build_app(
        {**cdk_context(), **CONTEXT},
        config_file=tmp_path_factory.mktemp("shared") / "absent.toml",
        stack_names=[STACK_NAME, *MEMBERS],  # the SageMaker stacks are the committed whole app's
    )
    assembly = app.synth()  # raises on any unacknowledged cdk-nag finding
    return Path(assembly.directory)


@pytest.fixture(scope="session")
def shared_templates(shared_assembly: Path) -> dict[str, dict[str, Any]]:
    return {s: json.loads((shared_assembly / f"{s}.template.json").read_text()) for s in (STACK_NAME, *MEMBERS)}
