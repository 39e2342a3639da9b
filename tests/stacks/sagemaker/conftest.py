"""The SageMaker constructs' shared inputs: a bare regional stack (tests/stacks/constructs/conftest.py's pattern), a
bucket, the image's assets, a runtime spec and a plan from the committed catalog."""

from __future__ import annotations

import aws_cdk as cdk
import pytest
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets

from gguf_serve.catalog.hosting import plan_sagemaker, sagemaker_profile
from stacks.app import cli_context
from stacks.image_inputs import ROOT
from tests.committed import CATALOG, profile_by_stack


class _PinnedZones(cdk.Stack):
    @property
    def availability_zones(self) -> list[str]:
        return ["cn-northwest-1a", "cn-northwest-1b"]


@pytest.fixture
def stack() -> cdk.Stack:
    env = cdk.Environment(account="111122223333", region="cn-northwest-1")
    return _PinnedZones(cdk.App(context=cli_context()), "Test", env=env)


@pytest.fixture
def bucket(stack) -> s3.Bucket:
    return s3.Bucket(stack, "Models")


@pytest.fixture
def assets(stack) -> tuple[s3_assets.Asset, s3_assets.Asset]:
    """Two small stand-in assets (the image build's source and staged sources are hundreds of MB)."""
    docs = str(ROOT / "docker" / "keyrings")
    return s3_assets.Asset(stack, "Context", path=docs), s3_assets.Asset(stack, "Sources", path=docs)


def on_sagemaker(stack_name: str):
    """(profile on its ml type, hosting, plan) for an EC2 stack's profile."""
    profile = profile_by_stack(stack_name)
    hosting = CATALOG.hosting[profile.hardware.instance_type]
    on = sagemaker_profile(profile, hosting)
    return on, hosting, plan_sagemaker(on, hosting)


@pytest.fixture(scope="session")
def assembly(committed) -> cdk.cx_api.CloudAssembly:
    """The committed whole app's cloud assembly (tests/whole_app.py), read back: its SageMaker stacks are in it."""
    return cdk.cx_api.CloudAssembly(str(committed.directory))
