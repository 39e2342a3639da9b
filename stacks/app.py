"""Composition root: one ServingStack per profile with a stack (profiles/serving/*.toml). Deterministic.

`build_app` is the one path to the app: `app.py` (what `cdk synth|deploy` runs) and the tests both call it, so
the tests see the same options, feature flags and policy-validation plugins (cdk-nag) as the CLI.

The one network read: a stack's model with no lock from ModelScope's listing is locked on first synth and written
to the lock file, as the CDK keeps a context lookup in cdk.context.json (gguf_serve/catalog/lookup.py says which
stacks and why). With every model listing-locked, synth opens no socket.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from gguf_serve.catalog import ServingProfile
from gguf_serve.catalog.loader import LOCK_NAME, PROFILES_DIR, load_catalog
from gguf_serve.catalog.lookup import resolve_locks, stack_models
from gguf_serve.catalog.profiles import deploy_refusal
from gguf_serve.errors import InputError
from stacks.options import DEPLOY_CONFIG, OPTION_NAMES, DeployOptionError, DeployOptions, load_options
from stacks.serving_stack import ServingStack

ROOT = Path(__file__).resolve().parent.parent
# `-c modelLock=<file>`: read and write another lock file than profiles/models.lock.toml (a relative path: from
# the repo root). `-c modelLookup=false`: never read ModelScope at synth; an unlocked model's stacks are refused.
MODEL_LOCK_CONTEXT = "modelLock"
MODEL_LOOKUP_CONTEXT = "modelLookup"


def cli_context() -> dict[str, Any]:
    """What `cdk synth` puts in the app's context from cdk.json and cdk.context.json (pytest's App reads neither)."""
    ctx = json.loads((ROOT / "cdk.json").read_text())["context"]
    ctx.update(json.loads((ROOT / "cdk.context.json").read_text()))
    return ctx


def main(
    context: dict[str, Any] | None = None, *, config_file: Path = DEPLOY_CONFIG, profiles_dir: Path = PROFILES_DIR
) -> int:
    """What `cdk synth|deploy` runs (app.py): the app, synthesized; or, for any bad input (a profile or lock file, a
    deploy option, a construct's props), one line on stderr that says what to change, and exit status 1."""
    try:
        build_app(context, config_file=config_file, profiles_dir=profiles_dir).synth()
    except InputError as bad:
        print(f"error: {bad}", file=sys.stderr)
        return 1
    return 0


def build_app(
    context: dict[str, Any] | None = None,
    *,
    config_file: Path = DEPLOY_CONFIG,
    profiles_dir: Path = PROFILES_DIR,
    stack_names: list[str] | None = None,
    refusals: dict[str, str] | None = None,
) -> cdk.App:
    """The app; `stack_names` limits it to those stacks (and their model lookups). A refused stack is still built
    and carries its refusal as an error annotation, which the CLI reports when that stack is selected; with
    `refusals` given, the reason goes there instead (the pre-flight checks a refused stack's account needs too)."""
    app = cdk.App(context=context) if context is not None else cdk.App()
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    options = load_options(_context_values(app), config_file)
    zones = (app.node.try_get_context("pinned-availability-zones") or {}).get(options.region)
    if not zones:
        raise DeployOptionError(
            f"region {options.region!r} has no pinned availability zones: add it to 'pinned-availability-zones' in "
            "cdk.context.json (synth never looks zones up)"
        )
    lock_file = model_lock_file(app.node.try_get_context(MODEL_LOCK_CONTEXT), profiles_dir)
    models = stack_models(profiles_dir)
    if stack_names is not None:
        models = {name: model for name, model in models.items() if name in stack_names}
    lookups = str(app.node.try_get_context(MODEL_LOOKUP_CONTEXT)).lower() not in ("false", "0", "no", "off")
    resolution = resolve_locks(models.values(), root=profiles_dir, lock_file=lock_file, lookups=lookups)
    catalog = load_catalog(profiles_dir, lock_file=lock_file, skip_unlocked=True)
    built = {p.stack_name: p for p in catalog.profiles.values()}
    env = cdk.Environment(account=options.account, region=options.region)
    for stack_name, model in models.items():
        profile = built.get(stack_name)
        if profile is None:
            # No lock entry at all, so nothing to plan from: an empty stack carries the refusal, so that
            # `cdk deploy <it>` says why while the other stacks synthesize and deploy.
            stack: cdk.Stack = cdk.Stack(app, stack_name, env=env)
            cdk.CfnWaitConditionHandle(stack, "ModelNotLocked")  # a template needs one resource to be valid
        else:
            stack = ServingStack(
                app,
                stack_name,
                profile=apply_options(profile, options),
                availability_zones=list(zones),
                certificate_arn=options.certificate_arn,
                image_build_args=options.image_build_args,
                arm64_builder=options.arm64_builder,
                debian_mirror=options.debian_mirror,
                env=env,
            )
        why = resolution.refused.get(model)
        if not why and profile is None:
            why = f"model {model} has no entry in {lock_file}; run `gguf-serve-catalog lock {model}`"
        refusal = f"{stack_name}: {why}" if why else deploy_refusal(profile) if profile else None
        if refusal and refusals is not None:
            refusals[stack_name] = refusal
        elif refusal:
            # Not an exception: the app synthesizes every stack, and `cdk deploy GravitonMoeStack` must still work.
            # The CLI refuses to synth or deploy a selected stack that carries an error annotation.
            cdk.Annotations.of(stack).add_error(refusal)
    return app


def model_lock_file(context_value: str | None = None, profiles_dir: Path = PROFILES_DIR) -> Path:
    """The lock file synth reads and, on a lookup, writes: `-c modelLock=<file>`, else profiles/models.lock.toml."""
    return ROOT / context_value if context_value else profiles_dir / LOCK_NAME


def stack_profiles(lock: str | None = None) -> list[ServingProfile]:
    """The profiles that are stacks, from the committed lock or `-c modelLock=<file>`, as they stand (no lookup;
    a profile without a stack runs locally only: launcher local, workstations)."""
    catalog = load_catalog(lock_file=model_lock_file(lock), skip_unlocked=True)
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
        min_capacity=profile.fleet.min_capacity if options.min_capacity is None else options.min_capacity,
        wake_on_request=options.wake_on_request,
    )
    return replace(profile, fleet=fleet)


def _context_values(app: cdk.App) -> dict[str, Any]:
    return {name: app.node.try_get_context(name) for name in OPTION_NAMES}
