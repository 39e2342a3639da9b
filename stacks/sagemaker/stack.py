"""One profile's SageMaker endpoint: network, bucket, image, staged model, endpoint, scaling and monitoring."""

from __future__ import annotations

from dataclasses import replace

from aws_cdk import Aspects, Aws, CfnOutput, Stack
from constructs import Construct

from gguf_serve.catalog import ServingProfile
from gguf_serve.catalog.hosting import SageMakerHosting, endpoint_name, plan_sagemaker
from gguf_serve.catalog.images import DEFAULT_ARM64_BUILDER, DEFAULT_DEBIAN_MIRRORS
from stacks.access_logs import AccessLogs
from stacks.checkov import CheckovAcknowledgements
from stacks.fleet_cost import cost_basis
from stacks.image_build import ImageBuild
from stacks.model_cache import ModelCache
from stacks.nag import acknowledge
from stacks.sagemaker.endpoint import SageMakerEndpoint
from stacks.sagemaker.monitoring import EndpointMonitoring
from stacks.sagemaker.network import EndpointNetwork
from stacks.sagemaker.scaling import EndpointScaling
from stacks.sagemaker.staging import ModelStaging


class SageMakerStack(Stack):
    """A profile already on its ml type (gguf_serve.catalog.hosting.sagemaker_profile); the stack composes."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        profile: ServingProfile,
        hosting: SageMakerHosting,
        availability_zones: list[str],
        image_build_args: dict[str, str] | None = None,
        arm64_builder: str = DEFAULT_ARM64_BUILDER,
        debian_mirrors: tuple[str, ...] = DEFAULT_DEBIAN_MIRRORS,
        scaling_metric: str = "concurrency",
        inference_ami: bool = True,
        **kwargs,
    ) -> None:
        """scaling_metric: -c sagemakerScalingMetric (stacks/sagemaker/scaling.py); inference_ami: false leaves the
        GPU variant's InferenceAmiVersion out (-c sagemakerInferenceAmi=false). The others are the EC2 stacks'."""
        super().__init__(
            scope, construct_id, description=f"SageMaker {hosting.ml_type}: {profile.description}", **kwargs
        )
        self._azs = availability_zones
        self._acknowledge()
        plan, f, runtime = plan_sagemaker(profile, hosting), profile.fleet, profile.runtime()
        if not inference_ami:
            plan = replace(plan, inference_ami=None)
        network = EndpointNetwork(self, "Network", cidr=f.network.vpc_cidr, max_azs=f.network.max_azs)
        cache = ModelCache(self, "ModelCache", access_logs=AccessLogs(self, "AccessLogs").bucket)
        image = ImageBuild(
            self, "Image", target=profile.image, build_args=image_build_args, arm64_builder=arm64_builder,
            debian_mirrors=debian_mirrors,
        )  # fmt: skip
        staging = ModelStaging(
            self, "Staging", runtime=runtime, bucket=cache.bucket, context=image.context_asset,
            sources=image.sources_asset, timeout_s=plan.staging_s,
        )  # fmt: skip
        endpoint = SageMakerEndpoint(
            self, "Serving", endpoint_name=endpoint_name(profile), runtime=runtime, plan=plan,
            image_uri=image.image_uri, repository=image.repository, bucket=cache.bucket,
            model_prefix_uri=staging.prefix_uri, model_key_prefix=staging.key_prefix, subnets=network.subnets,
            security_group=network.security_group,
        )  # fmt: skip
        endpoint.model.node.add_dependency(staging.resource, image.build)  # the model's data and image exist first
        self.scaling = EndpointScaling(
            self, "Scaling", endpoint_name=endpoint.endpoint_name, variant_name=endpoint.variant_name,
            endpoint=endpoint.endpoint, min_instances=plan.min_instances, max_instances=plan.max_instances,
            target_concurrency=plan.target_concurrency,
            target_busy_percent=round(100 * f.scaling.target_busy_slot_ratio, 1), metric=scaling_metric,
        )  # fmt: skip
        self.monitoring = EndpointMonitoring(
            self, "Monitoring", name=self.stack_name, endpoint_name=endpoint.endpoint_name,
            variant_name=endpoint.variant_name, deferred_alarm=f.alarms.deferred_alarm,
            has_gpu=profile.hardware.has_gpu, mtp=profile.mtp,
            cost=cost_basis(profile, profile.hardware, rate_type=hosting.ec2_type or None),
            cost_multiple=f.alarms.cost_multiple,
        )  # fmt: skip
        self.profile, self.hosting, self.plan, self.endpoint, self.staging = profile, hosting, plan, endpoint, staging
        self._outputs(endpoint)

    def _acknowledge(self) -> None:
        acknowledge(
            self,
            "CloudFormation-Validate::W3010",
            "Zones are pinned on purpose in cdk.context.json: no lookup at synth.",
        )
        Aspects.of(self).add(CheckovAcknowledgements())

    def _outputs(self, endpoint: SageMakerEndpoint) -> None:
        CfnOutput(
            self, "EndpointName", value=endpoint.endpoint_name, description="SageMaker endpoint (IAM is the gate)"
        )
        CfnOutput(
            self,
            "InvokeExample",
            description="A streamed chat completion with the AWS CLI (docs/sagemaker.md has the boto3 call)",
            value=(
                f"aws sagemaker-runtime invoke-endpoint-with-response-stream --region {Aws.REGION} "
                f"--endpoint-name {endpoint.endpoint_name} --content-type application/json "
                '--body \'{"messages":[{"role":"user","content":"你好"}],"max_tokens":256,"stream":true}\' '
                "--cli-binary-format raw-in-base64-out /dev/stdout"
            ),
        )

    @property
    def availability_zones(self) -> list[str]:
        return self._azs
