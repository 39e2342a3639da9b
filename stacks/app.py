"""Composition root: one ServingStack per profile with a stack (profiles/serving/*.toml). Deterministic, offline.

`build_app` is the one path to the app: `app.py` (what `cdk synth|deploy` runs) and the tests both call it, so
the tests see the same options, feature flags and policy-validation plugins (cdk-nag) as the CLI.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import replace
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from catalog import ProfileError, ServingProfile
from catalog.loader import default_catalog, load_catalog
from catalog.profiles import deploy_refusal
from stacks.options import DEPLOY_CONFIG, OPTION_NAMES, DeployOptions, load_options
from stacks.serving_stack import ServingStack

ROOT = Path(__file__).resolve().parent.parent
# `-c modelLock=<file>`: synthesize with another lock file than profiles/models.lock.toml (the tests' test-data lock)
MODEL_LOCK_CONTEXT = "modelLock"


def cli_context() -> dict[str, Any]:
    """What `cdk synth` puts in the app's context from cdk.json and cdk.context.json (pytest's App reads neither)."""
    ctx = json.loads((ROOT / "cdk.json").read_text())["context"]
    ctx.update(json.loads((ROOT / "cdk.context.json").read_text()))
    return ctx


def build_app(
    context: dict[str, Any] | None = None,
    *,
    config_file: Path = DEPLOY_CONFIG,
    stack_names: Collection[str] | None = None,
) -> cdk.App:
    """The app; `stack_names` limits it to those stacks (the pre-flight synthesizes only what it checks)."""
    app = cdk.App(context=context) if context is not None else cdk.App()
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    options = load_options(_context_values(app), config_file)
    zones = (app.node.try_get_context("pinned-availability-zones") or {}).get(options.region)
    if not zones:
        raise ProfileError(
            f"no pinned availability zones for region {options.region!r}: add it to 'pinned-availability-zones' in "
            "cdk.context.json (synth never looks zones up)"
        )
    for profile in stack_profiles(app.node.try_get_context(MODEL_LOCK_CONTEXT)):
        if stack_names is not None and profile.stack_name not in stack_names:
            continue
        stack = ServingStack(
            app,
            profile.stack_name,
            profile=apply_options(profile, options),
            availability_zones=list(zones),
            certificate_arn=options.certificate_arn,
            image_build_args=options.image_build_args,
            arm64_builder=options.arm64_builder,
            env=cdk.Environment(account=options.account, region=options.region),
        )
        refusal = deploy_refusal(profile)
        if refusal:
            # Not an exception: the app synthesizes every stack, and `cdk deploy GravitonMoeStack` must still work.
            # The CLI refuses to synth or deploy a selected stack that carries an error annotation.
            cdk.Annotations.of(stack).add_error(refusal)
    return app


def stack_profiles(lock: str | None = None) -> list[ServingProfile]:
    """The profiles that are stacks, from the committed lock or `-c modelLock=<file>` (a profile without a stack
    runs locally only: launcher local, workstations)."""
    catalog = load_catalog(lock_file=ROOT / lock) if lock else default_catalog()
    return [p for p in catalog.profiles.values() if p.stack_name]


def apply_options(profile: ServingProfile, options: DeployOptions) -> ServingProfile:
    """The fleet as deployed: options on top of the catalog's fleet settings."""
    spot = options.spot and not profile.hardware.has_gpu  # g5 Spot capacity in China is scarce: GPU stays on demand
    fleet = replace(
        profile.fleet,
        allowed_cidrs=options.allowed_cidrs,
        spot=spot,
        off_hours=options.off_hours,
        # PutWarmPool "cannot be called on an Auto Scaling group that has a mixed instances policy or a launch
        # template ... that requests Spot Instances" (EC2 Auto Scaling API Reference): Spot groups go without one.
        warm_pool_size=0 if spot else profile.fleet.warm_pool_size if options.warm_pool is None else options.warm_pool,
    )
    return replace(profile, fleet=fleet)


def _context_values(app: cdk.App) -> dict[str, Any]:
    return {name: app.node.try_get_context(name) for name in OPTION_NAMES}
