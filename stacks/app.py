"""Composition root: one ServingStack per profile in the catalog. Deterministic, no AWS calls at synth."""

from __future__ import annotations

from typing import Any

import aws_cdk as cdk

from catalog import PROFILES, ProfileError
from stacks.serving_stack import ServingStack

DEFAULT_REGION = "cn-northwest-1"


def build_app(context: dict[str, Any] | None = None) -> cdk.App:
    app = cdk.App(context=context) if context is not None else cdk.App()
    region = app.node.try_get_context("region") or DEFAULT_REGION
    account = app.node.try_get_context("account")  # None: resolved by CloudFormation at deploy
    zones = (app.node.try_get_context("pinned-availability-zones") or {}).get(region)
    if not zones:
        raise ProfileError(
            f"no pinned availability zones for region {region!r}: add it to 'pinned-availability-zones' in "
            "cdk.context.json (synth never looks zones up)"
        )
    certificate_arn = app.node.try_get_context("certificateArn")
    for profile in PROFILES.values():
        ServingStack(
            app,
            profile.stack_name,
            profile=profile,
            availability_zones=list(zones),
            certificate_arn=certificate_arn,
            env=cdk.Environment(account=account, region=region),
        )
    return app
