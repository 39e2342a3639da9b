"""The SageMaker stacks in the app: one per serving profile whose EC2 type profiles/sagemaker.toml hosts.

Named `<Name>SageMakerStack` beside `<Name>Stack` (gguf_serve.catalog.hosting.sagemaker_stack_name). A stack whose
model has no lock entry, or no pinned sha256, is built empty with its refusal as an error annotation, as the EC2
stacks are: `cdk deploy` of it says why, and every other stack still synthesizes.
"""

from __future__ import annotations

from collections.abc import Mapping

import aws_cdk as cdk

from gguf_serve.catalog import ProfileError, ServingProfile
from gguf_serve.catalog.hosting import SageMakerHosting, sagemaker_profile, sagemaker_stack_name
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
) -> None:
    """models: EC2 stack name -> model, for the stacks whose SageMaker twin is wanted; built: the built profiles by
    EC2 stack name; refused: model -> why its lock was refused (gguf_serve.catalog.lookup.Resolution); unbuilt: EC2
    stack name -> why its profile did not load (the twin is refused for the same reason)."""
    for ec2_name, model in models.items():
        profile = built.get(ec2_name)
        if profile is not None and profile.hardware.instance_type not in hosting:
            continue  # SageMaker hosts no type for this profile: no twin
        name = sagemaker_stack_name(ec2_name)
        why = refused.get(model) or (None if profile else _unbuilt(ec2_name, model, unbuilt or {}))
        stack: cdk.Stack | None = None
        if profile is not None and not why:
            try:
                on_sagemaker = sagemaker_profile(profile, hosting[profile.hardware.instance_type])
                why = deploy_refusal(on_sagemaker)
                if not why:
                    stack = SageMakerStack(
                        app, name, profile=on_sagemaker, hosting=hosting[profile.hardware.instance_type],
                        availability_zones=list(zones), image_build_args=options.image_build_args,
                        arm64_builder=options.arm64_builder, debian_mirrors=options.debian_mirrors, env=env,
                    )  # fmt: skip
            except ProfileError as e:
                why = str(e)
        if stack is None:
            stack = cdk.Stack(app, name, env=env)
            cdk.CfnWaitConditionHandle(stack, "NotDeployable")  # a template needs one resource to be valid
        if why and refusals is not None:
            refusals[name] = why if why.startswith(name) else f"{name}: {why}"
        elif why:
            cdk.Annotations.of(stack).add_error(why if why.startswith(name) else f"{name}: {why}")


def _unbuilt(ec2_name: str, model: str, unbuilt: Mapping[str, str]) -> str:
    """Why a twin has no profile to be built from: its EC2 profile's own failure, else the missing lock entry."""
    why = unbuilt.get(ec2_name)
    if why:
        return f"its profile (the one {ec2_name} deploys) does not load: {why}"
    return f"model {model} has no lock entry; lock it first"
