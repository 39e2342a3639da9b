"""Composition root: one ServingStack per profile in the catalog. Deterministic, no AWS calls at synth."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import aws_cdk as cdk

from catalog import PROFILES, ProfileError
from catalog.fleet import FleetSettings
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
    build_args = _build_args(app.node.try_get_context("imageBuildArgs"))
    for profile in PROFILES.values():
        profile = replace(profile, fleet=_fleet_options(app, profile.fleet, cpu_only=not profile.hardware.has_gpu))
        ServingStack(
            app,
            profile.stack_name,
            profile=profile,
            availability_zones=list(zones),
            certificate_arn=certificate_arn,
            image_build_args=build_args,
            env=cdk.Environment(account=account, region=region),
        )
    return app


def _fleet_options(app: cdk.App, fleet: FleetSettings, *, cpu_only: bool) -> FleetSettings:
    """Deploy-time options users set with -c: allowedCidrs=10.0.0.0/8,..., spot=true (CPU stacks), offHours=20-8."""
    changes: dict[str, Any] = {}
    if cidrs := app.node.try_get_context("allowedCidrs"):
        changes["allowed_cidrs"] = tuple(c.strip() for c in str(cidrs).split(",") if c.strip())
    if cpu_only and str(app.node.try_get_context("spot")).lower() == "true":
        changes["spot"] = True
    if off := app.node.try_get_context("offHours"):
        try:
            stop, start = (int(h) for h in str(off).split("-"))
        except ValueError:
            raise ProfileError(f"offHours={off!r}: write it as STOP-START hours, e.g. -c offHours=20-8") from None
        changes["off_hours"] = (stop, start)
    return replace(fleet, **changes)


def _build_args(value: Any) -> dict[str, str]:
    """-c imageBuildArgs=PIP_INDEX_URL=https://mirror/simple,BASE_IMAGE=<ecr>/mirror/ubuntu:24.04"""
    if not value:
        return {}
    pairs = [p.split("=", 1) for p in str(value).split(",") if p.strip()]
    if any(len(p) != 2 or not p[0].strip() for p in pairs):
        raise ProfileError(f"imageBuildArgs={value!r}: write NAME=value pairs separated by commas")
    return {k.strip(): v.strip() for k, v in pairs}
