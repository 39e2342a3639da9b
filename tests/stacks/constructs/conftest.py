"""Each construct built alone, in a bare stack of an app that carries cdk.json's feature flags (pytest's App reads
no cdk.json: without them the same code synthesizes other resources). Env-agnostic: no zone lookup, no dummy zones."""

from __future__ import annotations

import aws_cdk as cdk
import pytest

from stacks.app import cli_context


@pytest.fixture
def stack() -> cdk.Stack:
    return cdk.Stack(cdk.App(context=cli_context()), "Test")


class _PinnedZones(cdk.Stack):
    """A stack in cn-northwest-1 whose zones are pinned (as ServingStack's are): no lookup, no dummy zones."""

    @property
    def availability_zones(self) -> list[str]:
        return ["cn-northwest-1a", "cn-northwest-1b"]


@pytest.fixture
def regional_stack() -> cdk.Stack:
    """For constructs that need a concrete region (the ALB's log delivery account)."""
    env = cdk.Environment(account="111122223333", region="cn-northwest-1")
    return _PinnedZones(cdk.App(context=cli_context()), "Test", env=env)
