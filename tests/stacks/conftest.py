from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from stacks.app import build_app
from tests.committed import PROFILES
from tests.conftest import cdk_context

STACK_NAMES = [p.stack_name for p in PROFILES.values()]
CERT = "arn:aws-cn:acm:cn-northwest-1:111122223333:certificate/0a1b2c3d-1111-2222-3333-444455556666"
IAM_CERT = "arn:aws-cn:iam::111122223333:server-certificate/llama-internal"
# Each documented deploy option alone, then the combinations the README suggests.
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
# The whole app is synthesized (cdk-nag, then cfn-lint and checkov) for the fewest documented sets that hold every
# option: the combinations, plus "off-hours" (the wake tests compare with it), "no-warm-pool", "build-args",
# "native-arm64-builder" and "beijing", each the only set of its option. What one option does to one construct is
# tested on that construct (tests/stacks/constructs/), its parsing and mapping onto the fleet in
# test_deploy_options.py, and every set in DOCUMENTED is parsed there.
SYNTHESIZED = (
    "cost-saver",
    "scale-from-zero",
    "off-hours",
    "off-hours-wake",
    "locked-down",
    "build-args",
    "no-warm-pool",
    "native-arm64-builder",
    "beijing",
)


@pytest.fixture(scope="session")
def app() -> cdk.App:
    return build_app(cdk_context())


@pytest.fixture(scope="session")
def assembly(app: cdk.App) -> cdk.cx_api.CloudAssembly:
    return app.synth()


@pytest.fixture(scope="session")
def templates(app: cdk.App) -> dict[str, Template]:
    return {name: Template.from_stack(app.node.find_child(name)) for name in STACK_NAMES}


@pytest.fixture(scope="session")
def template_files(assembly) -> dict[str, Path]:
    return {s.stack_name: Path(assembly.directory) / s.template_file for s in assembly.stacks}


def scrub(template: dict) -> dict:
    """Asset hashes, image tags and the release id (a hash of the image tag) change with any source edit of the
    image's packages; the snapshot is about structure (tests/userdata/test_release_id.py covers the id)."""
    text = json.dumps(template, indent=1, sort_keys=True)
    text = re.sub(r"[0-9a-f]{64}", "<asset-hash>", text)
    text = re.sub(r"(arm64-cpu|x86-64-cpu|cuda)-[0-9a-f]{16}", r"\1-<hash>", text)
    text = re.sub(r"(?<![0-9a-f])[0-9a-f]{16}(?![0-9a-f])", "<release>", text)
    return json.loads(text)


@pytest.fixture(scope="session")
def synthesized(tmp_path_factory) -> dict[str, dict[str, Path]]:
    """The SYNTHESIZED option sets, each synthesized with cdk-nag (build_app adds it, as for `cdk synth`)."""
    out = {}
    for name in SYNTHESIZED:
        app = build_app(
            {**cdk_context(), **DOCUMENTED[name]},
            config_file=tmp_path_factory.mktemp(name) / "absent.toml",
            stack_names=STACK_NAMES,  # the options are the fleet's; the SageMaker stacks are in the default app
        )
        assembly = app.synth()  # raises on any unacknowledged cdk-nag finding or rule error
        out[name] = {s.stack_name: Path(assembly.directory) / s.template_file for s in assembly.stacks}
    return out
