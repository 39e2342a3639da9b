"""The SageMaker stacks in the app: one per serving profile whose EC2 type profiles/sagemaker.toml hosts (a twin), and
one per endpoint profile (profiles/sagemaker/: an ml type of its own, no EC2 twin).

A twin is named `<Name>SageMakerStack` beside `<Name>Stack` (gguf_serve.catalog.hosting.sagemaker_stack_name); an
endpoint profile names its stack. A stack whose model has no lock entry, or no pinned sha256, is built empty with
its refusal as an error annotation, as the EC2 stacks are: `cdk deploy` of it says why, and every other stack still
synthesizes. A stack whose ml type its region does not host (profiles/sagemaker-hosted.toml) is built and refused
the same way, with the stacks that serve its model there, unless the deploy says sagemakerUnlistedTypes: CreateEndpoint
is the last resource of the stack, so the refusal would otherwise come after the image build and the model staging.
"""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk

from gguf_serve.catalog import ProfileError, ServingProfile
from gguf_serve.catalog.hosting import HostedTypes, SageMakerHosting, sagemaker_profile, sagemaker_stack_name
from gguf_serve.catalog.profiles import deploy_refusal
from stacks.options import DeployOptions
from stacks.sagemaker.stack import SageMakerStack


def add_sagemaker_stacks(
    app: cdk.App,
    *,
    models: Mapping[str, str],
    built: Mapping[str, ServingProfile],
    hosting: Mapping[str, SageMakerHosting],
    refused: Mapping[str, str],
    unbuilt: Mapping[str, str] | None = None,
    options: DeployOptions,
    zones: list[str],
    env: cdk.Environment,
    refusals: dict[str, str] | None = None,
    endpoints: Mapping[str, str] | None = None,
    endpoint_profiles: Mapping[str, ServingProfile] | None = None,
    endpoint_types: Mapping[str, SageMakerHosting] | None = None,
    hosted: HostedTypes | None = None,
) -> None:
    """models: EC2 stack name -> model, for the stacks whose SageMaker twin is wanted; built: the built profiles by
    EC2 stack name; refused: model -> why its lock was refused (gguf_serve.catalog.lookup.Resolution); unbuilt:
    stack name (EC2 for a twin, its own for an endpoint profile) -> why its profile did not load.
    endpoints: endpoint stack -> model, those wanted; endpoint_profiles: the built ones by stack; endpoint_types:
    their ml types; hosted: the ml types each region hosts."""
    unbuilt, hosted = unbuilt or {}, hosted or HostedTypes("", {})
    wanted: list[tuple[str, str, ServingProfile | None, SageMakerHosting | None, str | None]] = []
    for ec2_name, model in models.items():
        profile = built.get(ec2_name)
        if profile is not None and profile.hardware.instance_type not in hosting:
            continue  # SageMaker hosts no type for this profile: no twin
        why = refused.get(model) or (None if profile else _unbuilt(ec2_name, model, unbuilt))
        on_sagemaker = None
        if profile is not None and not why:
            try:
                on_sagemaker = sagemaker_profile(profile, hosting[profile.hardware.instance_type])
            except ProfileError as e:
                why = str(e)
        host = hosting.get(profile.hardware.instance_type) if profile else None
        wanted.append((sagemaker_stack_name(ec2_name), model, on_sagemaker, host, why))
    for name, model in (endpoints or {}).items():
        profile = (endpoint_profiles or {}).get(name)
        why = refused.get(model) or (None if profile else _unbuilt(name, model, {name: unbuilt.get(name, "")}))
        host = (endpoint_types or {}).get(profile.hardware.instance_type) if profile else None
        wanted.append((name, model, profile if not why else None, host, why))
    servers = _servers(wanted)
    for name, model, profile, host, why in wanted:
        stack: cdk.Stack | None = None
        if profile is not None and host is not None and not why:
            why = deploy_refusal(profile)
            if not why:
                stack = SageMakerStack(
                    app, name, profile=profile, hosting=host, availability_zones=list(zones),
                    image_build_args=options.image_build_args, arm64_builder=options.arm64_builder,
                    debian_mirrors=options.debian_mirrors, scaling_metric=options.sagemaker_scaling_metric,
                    inference_ami=options.sagemaker_inference_ami, env=env,
                )  # fmt: skip
                why = unhosted(name, host.ml_type, model, options, hosted, servers)
        if stack is None:
            stack = cdk.Stack(app, name, env=env)
            cdk.CfnWaitConditionHandle(stack, "NotDeployable")  # a template needs one resource to be valid
        if why and refusals is not None:
            refusals[name] = why if why.startswith(name) else f"{name}: {why}"
        elif why:
            cdk.Annotations.of(stack).add_error(why if why.startswith(name) else f"{name}: {why}")


def _servers(wanted: list) -> dict[str, list[tuple[str, str]]]:
    """model -> (stack, ml type) of each SageMaker stack that serves it, in the app's order."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, model, profile, host, why in wanted:
        if profile is not None and host is not None and not why:
            out.setdefault(model, []).append((name, host.ml_type))
    return out


def unhosted(
    name: str, ml_type: str, model: str, options: DeployOptions, hosted: HostedTypes,
    servers: Mapping[str, list[tuple[str, str]]],
) -> str | None:  # fmt: skip
    """Why a stack on `ml_type` must not deploy in the options' region, or None: hosted there, not known there (no
    pinned list: the pre-flight asks the account), or let through by sagemakerUnlistedTypes."""
    if options.sagemaker_unlisted_types or hosted.hosts(options.region, ml_type) is not False:
        return None
    here = [f"{s} ({t})" for s, t in servers.get(model, []) if s != name and hosted.hosts(options.region, t)]
    instead = (
        f"{' and '.join(here)} serve{'s' * (len(here) == 1)} {model} there: deploy "
        f"{'it' if len(here) == 1 else 'one of them'} instead"
        if here
        else f"no SageMaker stack of this app serves {model} there (add one: profiles/sagemaker/)"
    )
    return (
        f"{name}: {ml_type} is not hosted in {options.region} (profiles/sagemaker-hosted.toml, {hosted.source}), so "
        f"CreateEndpoint would refuse it after the image build and the model staging; {instead}; or, once "
        f"`gguf-serve-preflight {name}` finds the '{ml_type} for endpoint usage' quota in your account, "
        "-c sagemakerUnlistedTypes=true"
    )


def _unbuilt(stack_name: str, model: str, unbuilt: Mapping[str, str]) -> str:
    """Why a stack has no profile to be built from: its profile's own failure, else the missing lock entry."""
    why = unbuilt.get(stack_name)
    if why:
        return f"its profile (the one {stack_name} deploys) does not load: {why}"
    return f"model {model} has no lock entry; lock it first"
