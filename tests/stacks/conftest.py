from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from aws_cdk.assertions import Template

from stacks.app import build_app
from stacks.eks.stack import STACK_NAME as EKS_STACK
from stacks.shared_endpoint import STACK_NAME as SHARED_STACK
from tests.committed import PROFILES
from tests.conftest import cdk_context
from tests.stacks.eks.conftest import CONTEXT as EKS_CONTEXT
from tests.stacks.shared.conftest import CONTEXT as SHARED_CONTEXT
from tests.stacks.shared.conftest import MEMBERS as SHARED_MEMBERS
from tests.whole_app import CERT, IAM_CERT, OPTION_SETS, Synthesized

STACK_NAMES = [p.stack_name for p in PROFILES.values()]
# Each documented deploy option alone, then the combinations the docs suggest: every one is parsed
# (test_deploy_options.py). Whole apps are synthesized for the three sets of tests/whole_app.py only.
DOCUMENTED = {
    "spot": {"spot": "true"},
    "off-hours": {"offHours": "20-8"},
    "allowed-cidrs": {"allowedCidrs": "10.8.0.0/16,192.168.10.0/24"},
    "acm-certificate": {"certificateArn": CERT},
    "iam-certificate": {"certificateArn": IAM_CERT},
    "build-args": {"imageBuildArgs": "PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple"},
    "no-warm-pool": {"warmPool": "0"},
    "native-arm64-builder": {"arm64Builder": "native"},
    "beijing": {"region": "cn-north-1"},
    "cost-saver": {"spot": "true", "offHours": "20-8"},
    "scale-from-zero": {"minCapacity": "0", "wakeOnRequest": "true"},
    "off-hours-wake": {"offHours": "20-8", "wakeOnRequest": "true"},
    "locked-down": {"allowedCidrs": "10.8.0.0/16", "certificateArn": CERT, "offHours": "20-8"},
}
# The two whole-app sets besides the committed options; together they hold every option (the guard is in
# test_deploy_options.py).
SYNTHESIZED = tuple(name for name in OPTION_SETS if name != "committed")


@pytest.fixture(scope="session")
def committed(whole_apps) -> Synthesized:
    return whole_apps["committed"]


@pytest.fixture(scope="session")
def templates(committed: Synthesized) -> dict[str, Template]:
    return {name: Template.from_json(committed.template(name)) for name in STACK_NAMES}


@pytest.fixture(scope="session")
def template_files(committed: Synthesized) -> dict[str, Path]:
    return {name: committed.template_file(name) for name in committed.stacks}


def scrub(template: dict) -> dict:
    """Asset hashes, image tags and the release id (a hash of the image tag) change with any source edit of the
    image's packages; the snapshot is about structure (tests/userdata/test_release_id.py covers the id)."""
    text = json.dumps(template, indent=1, sort_keys=True)
    text = re.sub(r"[0-9a-f]{64}", "<asset-hash>", text)
    text = re.sub(r"(arm64-cpu|x86-64-cpu|cuda)-[0-9a-f]{16}", r"\1-<hash>", text)
    text = re.sub(r"(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])", "<release>", text)
    return json.loads(text)


@pytest.fixture(scope="session")
def synthesized(whole_apps) -> dict[str, dict[str, Path]]:
    """SYNTHESIZED option set -> stack -> its template file (synthesized with cdk-nag, as `cdk synth` does)."""
    return {name: {s: whole_apps[name].template_file(s) for s in whole_apps[name].stacks} for name in SYNTHESIZED}


# The two syntheses besides the whole apps, each through build_app (cdk-nag on, as `cdk synth` runs it), defined here
# once for every test under tests/stacks/ (a fixture imported into a second conftest or module would synthesize again).
@pytest.fixture(scope="session")
def eks_assembly(tmp_path_factory) -> Path:
    """EksServingStack alone (the EC2 and SageMaker stacks are the committed whole app's): tests/stacks/eks/."""
    app = build_app(
        {**cdk_context(), **EKS_CONTEXT},
        config_file=tmp_path_factory.mktemp("eks") / "absent.toml",
        stack_names=[EKS_STACK],
    )
    assembly = app.synth()  # raises on any unacknowledged cdk-nag finding
    return Path(assembly.directory) / assembly.get_stack_by_name(EKS_STACK).template_file


@pytest.fixture(scope="session")
def eks_template(eks_assembly: Path) -> dict[str, Any]:
    return json.loads(eks_assembly.read_text())


@pytest.fixture(scope="session")
def shared_assembly(tmp_path_factory) -> Path:
    """SharedEndpointStack and the EC2 stacks behind it (tests/stacks/shared/); the SageMaker stacks are the
    committed whole app's."""
    app = build_app(
        {**cdk_context(), **SHARED_CONTEXT},
        config_file=tmp_path_factory.mktemp("shared") / "absent.toml",
        stack_names=[SHARED_STACK, *SHARED_MEMBERS],
    )
    assembly = app.synth()  # raises on any unacknowledged cdk-nag finding
    return Path(assembly.directory)


@pytest.fixture(scope="session")
def shared_templates(shared_assembly: Path) -> dict[str, dict[str, Any]]:
    return {
        s: json.loads((shared_assembly / f"{s}.template.json").read_text()) for s in (SHARED_STACK, *SHARED_MEMBERS)
    }
