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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from gguf_serve.catalog.loader import LOCK_NAME, PROFILES_DIR, load_catalog
from gguf_serve.catalog.lookup import resolve_locks, stack_models
from gguf_serve.catalog.profiles import deploy_refusal
from gguf_serve.errors import InputError
from stacks.options import DEPLOY_CONFIG, OPTION_NAMES, DeployOptionError, DeployOptions, load_options
from stacks.plan import ServicePlan, plan_service
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


@dataclass(frozen=True)
class AppPlan:
    """Every stack the app builds, planned before any construct exists (the pre-flight reads the same plan)."""

    options: DeployOptions
    services: dict[str, ServicePlan]  # stack name -> its plan, in the profiles' order
    refusals: dict[str, str] = field(default_factory=dict)  # stack name -> why the CLI must not deploy it yet


def plan_app(
    context: dict[str, Any],
    *,
    config_file: Path = DEPLOY_CONFIG,
    profiles_dir: Path = PROFILES_DIR,
    stack_names: list[str] | None = None,
) -> AppPlan:
    """The deploy options, the catalog and the lock, resolved into one plan per stack; `stack_names` limits it to
    those stacks (and their model lookups). `context`: what the app's context holds (cdk.json, cdk.context.json, -c)."""
    options = load_options({name: context.get(name) for name in OPTION_NAMES}, config_file)
    zones = (context.get("pinned-availability-zones") or {}).get(options.region)
    if not zones:
        raise DeployOptionError(
            f"region {options.region!r} has no pinned availability zones: add it to 'pinned-availability-zones' in "
            "cdk.context.json (synth never looks zones up)"
        )
    lock_file = model_lock_file(context.get(MODEL_LOCK_CONTEXT), profiles_dir)
    models = stack_models(profiles_dir)
    if stack_names is not None:
        models = {name: model for name, model in models.items() if name in stack_names}
    lookups = str(context.get(MODEL_LOOKUP_CONTEXT)).lower() not in ("false", "0", "no", "off")
    resolution = resolve_locks(models.values(), root=profiles_dir, lock_file=lock_file, lookups=lookups)
    catalog = load_catalog(profiles_dir, lock_file=lock_file, skip_unlocked=True)
    built = {p.stack_name: p for p in catalog.profiles.values()}
    plan = AppPlan(options, {})
    for stack_name, model in models.items():
        profile = built.get(stack_name)
        plan.services[stack_name] = plan_service(profile or catalog.unlocked_frames[stack_name], options, tuple(zones))
        why = resolution.refused.get(model)
        if not why and profile is None:
            why = f"model {model} has no entry in {lock_file}; run `gguf-serve-catalog lock {model}`"
        refusal = f"{stack_name}: {why}" if why else deploy_refusal(profile) if profile else None
        if refusal:
            plan.refusals[stack_name] = refusal
    return plan


def build_app(
    context: dict[str, Any] | None = None,
    *,
    config_file: Path = DEPLOY_CONFIG,
    profiles_dir: Path = PROFILES_DIR,
    stack_names: list[str] | None = None,
    plan: AppPlan | None = None,
    annotate_refusals: bool = True,
    outdir: str | None = None,
) -> cdk.App:
    """The app, from `plan` or from the plan of its context. A refused stack is still built and carries its refusal
    as an error annotation, which the CLI reports when that stack is selected; `annotate_refusals=False` leaves it
    off (the pre-flight reports refusals itself and checks what a refused stack needs of the account too).
    `outdir`: where synth writes the cloud assembly (default: the CLI's, or a temporary folder)."""
    app = cdk.App(context=context, outdir=outdir) if context is not None else cdk.App(outdir=outdir)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    if plan is None:
        known = (*OPTION_NAMES, "pinned-availability-zones", MODEL_LOCK_CONTEXT, MODEL_LOOKUP_CONTEXT)
        values = {name: app.node.try_get_context(name) for name in known}
        plan = plan_app(values, config_file=config_file, profiles_dir=profiles_dir, stack_names=stack_names)
    env = cdk.Environment(account=plan.options.account, region=plan.options.region)
    for stack_name, service in plan.services.items():
        if service.profile is None:
            # No lock entry at all, so nothing to build from: an empty stack carries the refusal, so that
            # `cdk deploy <it>` says why while the other stacks synthesize and deploy.
            stack: cdk.Stack = cdk.Stack(app, stack_name, env=env)
            cdk.CfnWaitConditionHandle(stack, "ModelNotLocked")  # a template needs one resource to be valid
        else:
            stack = ServingStack(app, stack_name, plan=service, env=env)
        if annotate_refusals and stack_name in plan.refusals:
            # Not an exception: the app synthesizes every stack, and `cdk deploy GravitonMoeStack` must still work.
            # The CLI refuses to synth or deploy a selected stack that carries an error annotation.
            cdk.Annotations.of(stack).add_error(plan.refusals[stack_name])
    return app


def model_lock_file(context_value: str | None = None, profiles_dir: Path = PROFILES_DIR) -> Path:
    """The lock file synth reads and, on a lookup, writes: `-c modelLock=<file>`, else profiles/models.lock.toml."""
    return ROOT / context_value if context_value else profiles_dir / LOCK_NAME
