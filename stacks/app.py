"""Composition root: one ServingStack per profile with a stack (profiles/serving/*.toml), its SageMaker twin where
SageMaker hosts the profile's instance type (stacks/sagemaker/app.py), and EksServingStack when the deploy options
name its profiles. Deterministic.

`build_app` is the one path to the app: `app.py` (what `cdk synth|deploy` runs) and the tests both call it, so
the tests see the same options, feature flags and policy-validation plugins (cdk-nag) as the CLI.

The one network read: a stack's model with no lock from ModelScope's listing is locked on first synth and written
to the lock file, as the CDK keeps a context lookup in cdk.context.json (gguf_serve/catalog/lookup.py says which
stacks and why). With every model listing-locked, synth opens no socket.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from gguf_serve.catalog import ServingProfile
from gguf_serve.catalog.hosting import HostedTypes, SageMakerHosting, sagemaker_stack_name
from gguf_serve.catalog.loader import LOCK_NAME, PROFILES_DIR, ProfileFrame, load_catalog, load_frame
from gguf_serve.catalog.lookup import resolve_locks, stack_files, stack_models
from gguf_serve.catalog.profiles import deploy_refusal
from gguf_serve.errors import InputError
from stacks.eks.stack import STACK_NAME as EKS_STACK
from stacks.eks.stack import EksServingStack
from stacks.options import DEPLOY_CONFIG, OPTION_NAMES, RENAMED, DeployOptionError, DeployOptions, load_options
from stacks.plan import ServicePlan, plan_eks, plan_service
from stacks.sagemaker.app import add_sagemaker_stacks
from stacks.serving_stack import ServingStack
from stacks.shared_endpoint import STACK_NAME as SHARED_STACK
from stacks.shared_endpoint import SharedEndpointStack

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
    deploy option, a construct's props), one line on stderr that says what to change, and exit status 1. A refused
    stack carries its refusal as an error annotation, which the CLI reports for that stack only; where synth itself
    fails on them (cdk.json's annotationsInValidationReport, in-process), each refusal is said in one line instead
    of the validation report's traceback."""
    try:
        app = build_app(context, config_file=config_file, profiles_dir=profiles_dir)
    except InputError as bad:
        print(f"error: {bad}", file=sys.stderr)
        return 1
    try:
        app.synth()
    except RuntimeError:
        refusals = [str(m.data) for s in app.node.children for m in s.node.metadata if m.type == "aws:cdk:error"]
        if not refusals:
            raise
        for refusal in refusals:
            print(f"error: {refusal}", file=sys.stderr)
        return 1
    return 0


@dataclass(frozen=True)
class AppPlan:
    """Every stack the app builds, planned before any construct exists (the pre-flight reads the same plan)."""

    options: DeployOptions
    services: dict[str, ServicePlan]  # stack name -> its plan, in the profiles' order
    refusals: dict[str, str] = field(default_factory=dict)  # stack name -> why the CLI must not deploy it yet
    unplanned: tuple[str, ...] = ()  # stacks whose profile file cannot be read: built empty, refused
    # The SageMaker twins (stacks/sagemaker/app.py): EC2 stack -> model for each twin wanted, the built profiles by
    # EC2 stack, profiles/sagemaker.toml's hosting by EC2 type, and model -> why its lock was refused.
    twins: dict[str, str] = field(default_factory=dict)
    built: dict[str, ServingProfile] = field(default_factory=dict)
    hosting: dict[str, SageMakerHosting] = field(default_factory=dict)
    lock_refused: dict[str, str] = field(default_factory=dict)
    unbuilt: dict[str, str] = field(default_factory=dict)  # EC2 stack -> why its profile did not load (twins only)
    # The endpoint profiles (profiles/sagemaker/): stack -> model, the built ones by stack, their ml types, the
    # ml types each region hosts (profiles/sagemaker-hosted.toml)
    endpoints: dict[str, str] = field(default_factory=dict)
    endpoint_profiles: dict[str, ServingProfile] = field(default_factory=dict)
    endpoint_types: dict[str, SageMakerHosting] = field(default_factory=dict)
    hosted: HostedTypes = field(default_factory=lambda: HostedTypes("", {}))
    eks: tuple[ServicePlan, ...] = ()  # EksServingStack's profiles (eksProfiles), one plan each; () no cluster
    zones: tuple[str, ...] = ()  # the region's pinned zones
    # SharedEndpointStack's members (sharedEndpoint), one plan each whichever stacks are selected; () none. And the
    # names each member's fleet serves (a member whose model is not locked has none yet).
    shared: tuple[ServicePlan, ...] = ()
    shared_models: dict[str, tuple[str, ...]] = field(default_factory=dict)


def plan_app(
    context: dict[str, Any],
    *,
    config_file: Path = DEPLOY_CONFIG,
    profiles_dir: Path = PROFILES_DIR,
    stack_names: list[str] | None = None,
) -> AppPlan:
    """The deploy options, the catalog and the lock, resolved into one plan per stack; `stack_names` limits it to
    those stacks (and their model lookups). `context`: what the app's context holds (cdk.json, cdk.context.json, -c)."""
    options = load_options({name: context.get(name) for name in (*OPTION_NAMES, *RENAMED)}, config_file)
    zones = (context.get("pinned-availability-zones") or {}).get(options.region)
    if not zones:
        raise DeployOptionError(
            f"region {options.region!r} has no pinned availability zones: add it to 'pinned-availability-zones' in "
            "cdk.context.json (synth never looks zones up)"
        )
    lock_file = model_lock_file(context.get(MODEL_LOCK_CONTEXT), profiles_dir)
    models = stack_models(profiles_dir)
    twins = {n: m for n, m in models.items() if stack_names is None or sagemaker_stack_name(n) in stack_names}
    endpoints = stack_models(profiles_dir, "sagemaker")  # the endpoint profiles' stacks
    endpoints = {n: m for n, m in endpoints.items() if stack_names is None or n in stack_names}
    if stack_names is not None:
        models = {name: model for name, model in models.items() if name in stack_names}
    lookups = str(context.get(MODEL_LOOKUP_CONTEXT)).lower() not in ("false", "0", "no", "off")
    wanted = list(dict.fromkeys([*models.values(), *twins.values(), *endpoints.values()]))
    resolution = resolve_locks(
        wanted, root=profiles_dir, lock_file=lock_file, lookups=lookups, allow_typed=options.allow_typed_lock
    )
    # Tolerant: a model or profile that fails refuses its own stacks only; workstation profiles are no stacks.
    catalog = load_catalog(profiles_dir, lock_file=lock_file, skip_unlocked=True, tolerant=True, workstations=False)
    built = {p.stack_name: p for p in catalog.profiles.values()}
    files = stack_files(profiles_dir)
    services: dict[str, ServicePlan] = {}
    refusals: dict[str, str] = {}
    unplanned = []
    for stack_name, model in models.items():
        profile = built.get(stack_name)
        frame = profile or catalog.unlocked_frames.get(stack_name) or _frame(files.get(stack_name), catalog.hardware)
        if frame is None:
            unplanned.append(stack_name)
        else:
            services[stack_name] = plan_service(frame, options, tuple(zones))
        why = resolution.refused.get(model) or catalog.problems.get(str(files.get(stack_name)))
        if not why and profile is None:
            why = f"model {model} has no entry in {lock_file}; run `gguf-serve-catalog lock {model}`"
        refusal = f"{stack_name}: {why}" if why else deploy_refusal(profile) if profile else None
        if refusal:
            refusals[stack_name] = refusal
    shared = _shared_members(options, services, built, catalog, files, tuple(zones))
    eks: tuple[ServicePlan, ...] = ()
    if options.eks_profiles and (stack_names is None or EKS_STACK in stack_names):
        eks = plan_eks({name: p for name, p in catalog.profiles.items() if p.stack_name}, options, tuple(zones))
    return AppPlan(
        options, services, refusals, tuple(unplanned), twins=twins, built=built, hosting=catalog.hosting,
        lock_refused=dict(resolution.refused), eks=eks, zones=tuple(zones), shared=shared,
        shared_models={m.stack_name: built[m.stack_name].runtime().model.served_names for m in shared
                       if m.stack_name in built},
        unbuilt={
            **{n: why for n in twins if n not in built and (why := catalog.problems.get(str(files.get(n))))},
            **{n: why for n, path in stack_files(profiles_dir, "sagemaker").items()
               if n in endpoints and (why := catalog.problems.get(str(path)))},
        },  # fmt: skip
        endpoints=endpoints, endpoint_types=catalog.endpoint_types, hosted=catalog.hosted,
        endpoint_profiles={p.stack_name: p for p in catalog.endpoint_profiles.values() if p.stack_name in endpoints},
    )  # fmt: skip


def _shared_members(
    options: DeployOptions, services: dict[str, ServicePlan], built: dict[str, ServingProfile], catalog: Any,
    files: dict[str, Path], zones: tuple[str, ...],
) -> tuple[ServicePlan, ...]:  # fmt: skip
    """The plans of sharedEndpoint's stacks, in its order, whether or not this synth selected them (the shared stack
    is shaped by the first one, and routes to them all)."""
    unknown = [s for s in options.shared_endpoint if s not in files]
    if unknown:
        raise DeployOptionError(
            f"sharedEndpoint: no EC2 stack named {', '.join(unknown)}; use some of {', '.join(files)}"
        )
    members = []
    for name in options.shared_endpoint:
        if name in services:
            members.append(services[name])
            continue
        frame = built.get(name) or catalog.unlocked_frames.get(name) or _frame(files.get(name), catalog.hardware)
        if frame is None:
            raise DeployOptionError(f"sharedEndpoint: {name}'s profile ({files[name]}) cannot be read; fix it first")
        members.append(plan_service(frame, options, zones))
    return tuple(members)


def _frame(path: Path | None, hardware: Any) -> ProfileFrame | None:
    """What a profile file that failed to load still says (its instance, image, fleet), or None if that fails too."""
    try:
        return load_frame(path, hardware=hardware) if path else None
    except InputError:
        return None


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
    off and adds the refusals of the SageMaker and EKS stacks to `plan.refusals` (the pre-flight reports refusals
    itself and checks what a refused stack needs of the account too).
    `outdir`: where synth writes the cloud assembly (default: the CLI's, or a temporary folder)."""
    app = cdk.App(context=context, outdir=outdir) if context is not None else cdk.App(outdir=outdir)
    cdk.Validations.of(app).add_plugins(AwsSolutionsChecks(app))
    if plan is None:
        known = (*OPTION_NAMES, *RENAMED, "pinned-availability-zones", MODEL_LOCK_CONTEXT, MODEL_LOOKUP_CONTEXT)
        values = {name: app.node.try_get_context(name) for name in known}
        plan = plan_app(values, config_file=config_file, profiles_dir=profiles_dir, stack_names=stack_names)
    env = cdk.Environment(account=plan.options.account, region=plan.options.region)
    endpoint = None
    if plan.shared:
        endpoint = SharedEndpointStack(
            app, SHARED_STACK, members=list(plan.shared), models=plan.shared_models, env=env
        )  # fmt: skip
    for stack_name in [*plan.services, *plan.unplanned]:
        service = plan.services.get(stack_name)
        if service is None or service.profile is None:
            # No lock entry at all (or no profile to read), so nothing to build from: an empty stack carries the
            # refusal, so that `cdk deploy <it>` says why while the other stacks synthesize and deploy.
            stack: cdk.Stack = cdk.Stack(app, stack_name, env=env)
            cdk.CfnWaitConditionHandle(stack, "ModelNotLocked")  # a template needs one resource to be valid
        else:
            shared = endpoint if endpoint and stack_name in endpoint.members else None
            stack = ServingStack(app, stack_name, plan=service, endpoint=shared, env=env)
        if annotate_refusals and stack_name in plan.refusals:
            # Not an exception: the app synthesizes every stack, and `cdk deploy GravitonMoeStack` must still work.
            # The CLI refuses to synth or deploy a selected stack that carries an error annotation.
            cdk.Annotations.of(stack).add_error(plan.refusals[stack_name])
    if endpoint:
        _order_shared(app, endpoint)
    refusals = None if annotate_refusals else plan.refusals
    add_sagemaker_stacks(
        app, models=plan.twins, built=plan.built, hosting=plan.hosting, refused=plan.lock_refused,
        unbuilt=plan.unbuilt, options=plan.options, zones=list(plan.zones), env=env, refusals=refusals,
        endpoints=plan.endpoints, endpoint_profiles=plan.endpoint_profiles, endpoint_types=plan.endpoint_types,
        hosted=plan.hosted,
    )  # fmt: skip
    if plan.eks:
        _eks_stack(app, plan, env, refusals)
    return app


def _order_shared(app: cdk.App, endpoint: SharedEndpointStack) -> None:
    """A stack that routes a name earlier stacks serve too imports their target groups' exports: it deploys after
    them (CloudFormation refuses an import of an export not made yet)."""
    for name in endpoint.members:
        stack = app.node.try_find_child(name)
        for _, peers in endpoint.balanced(name) if isinstance(stack, ServingStack) else ():
            for peer in peers:
                if isinstance(earlier := app.node.try_find_child(peer), ServingStack):
                    stack.add_stack_dependency(earlier, f"routes a model {peer} serves too")


def _eks_stack(app: cdk.App, plan: AppPlan, env: cdk.Environment, refusals: dict[str, str] | None) -> None:
    """EksServingStack, only when deploy.toml or -c names its profiles (eksProfiles): no cluster by default."""
    options = plan.options
    stack = EksServingStack(
        app,
        EKS_STACK,
        plans=list(plan.eks),
        availability_zones=list(plan.zones),
        certificate_arn=options.certificate_arn,
        image_build_args=options.image_build_args,
        arm64_builder=options.arm64_builder,
        debian_mirrors=options.debian_mirrors,
        admin_role_arns=options.eks_admin_roles,
        auto_mode_fields=options.eks_auto_mode_fields,
        env=env,
    )
    profiles = [p.profile for p in plan.eks if p.profile is not None]
    why = "; ".join(r for r in (deploy_refusal(replace(p, stack_name="")) for p in profiles) if r)  # by profile name
    if why and refusals is not None:
        refusals[EKS_STACK] = f"{EKS_STACK}: {why}"
    elif why:
        cdk.Annotations.of(stack).add_error(f"{EKS_STACK}: {why}")


def model_lock_file(context_value: str | None = None, profiles_dir: Path = PROFILES_DIR) -> Path:
    """The lock file synth reads and, on a lookup, writes: `-c modelLock=<file>`, else profiles/models.lock.toml."""
    return ROOT / context_value if context_value else profiles_dir / LOCK_NAME


def stack_profiles(lock: str | None = None) -> list[ServingProfile]:
    """The profiles that are stacks, from the committed lock or `-c modelLock=<file>`, as the catalog holds them (no
    lookup, no deploy options; a profile without a stack runs locally only: launcher local, workstations)."""
    catalog = load_catalog(PROFILES_DIR, lock_file=model_lock_file(lock), skip_unlocked=True, workstations=False)
    return [p for p in catalog.profiles.values() if p.stack_name]
