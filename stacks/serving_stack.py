"""One deployable llama.cpp service: network, model cache, API key, image, fleet and load balancer."""

from __future__ import annotations

from aws_cdk import Aspects, Aws, CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_logs as logs
from constructs import Construct

from gguf_serve.catalog import ServingProfile
from gguf_serve.catalog.images import DEFAULT_ARM64_BUILDER, DEFAULT_DEBIAN_MIRRORS
from gguf_serve.container.metrics import names
from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.checkov import CheckovAcknowledgements
from stacks.fleet import ServingFleet
from stacks.image_build import ImageBuild
from stacks.load_balancer import InferenceLoadBalancer
from stacks.model_cache import ModelCache
from stacks.monitoring import ServiceMonitoring
from stacks.nag import acknowledge
from stacks.network import ServingNetwork
from stacks.scaling import FleetScaling
from stacks.wake_door import WakeDoor
from userdata import DeploySettings, InstanceSpec


class ServingStack(Stack):
    """One profile's service: it composes the constructs and wires them (grants, dependencies, outputs)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        profile: ServingProfile,
        availability_zones: list[str],
        certificate_arn: str | None = None,
        image_build_args: dict[str, str] | None = None,
        arm64_builder: str = DEFAULT_ARM64_BUILDER,
        debian_mirrors: tuple[str, ...] = DEFAULT_DEBIAN_MIRRORS,
        **kwargs,
    ) -> None:
        super().__init__(scope, construct_id, description=profile.description, **kwargs)
        self._azs = availability_zones
        self._acknowledge()
        f = profile.fleet
        network = ServingNetwork(self, "Network", cidr=f.vpc_cidr, max_azs=f.max_azs, nat_gateways=f.nat_gateways)
        access_logs = AccessLogs(self, "AccessLogs")
        cache = ModelCache(self, "ModelCache", access_logs=access_logs.bucket)
        api_key = ApiKey(self, "ApiKey")
        image = ImageBuild(
            self,
            "Image",
            target=profile.image,
            build_args=image_build_args,
            arm64_builder=arm64_builder,
            debian_mirrors=debian_mirrors,
        )
        log_group = logs.LogGroup(
            self, "ServerLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        fleet = ServingFleet(
            self, "Fleet", hardware=profile.hardware, fleet=f, instance=InstanceSpec.of(profile),
            deploy=self._deploy(image, api_key, cache, log_group), image_tag=image.image_tag,
            root_volume_gib=profile.root_volume_gib, boot_budget_s=profile.boot_budget_s, vpc=network.vpc,
        )  # fmt: skip
        fleet.asg.node.add_dependency(image.build)  # instances boot only once the image is in ECR
        fleet.allow_instances(secret=api_key.secret, cache=cache, repository=image.repository, log_group=log_group)
        lb = InferenceLoadBalancer(
            self,
            "LoadBalancer",
            vpc=network.vpc,
            vpc_cidr=f.vpc_cidr,
            access_logs=access_logs.bucket,
            targets=[fleet.asg],
            target_port=fleet.port,
            idle_timeout_s=f.alb_idle_timeout_s,
            deregistration_delay_s=f.deregistration_delay_s,
            allowed_cidrs=f.allowed_cidrs,
            certificate_arn=certificate_arn,
        )
        self.target_group = lb.target_group
        self._scale_and_watch(profile, fleet, lb)
        self.profile, self.fleet, self.load_balancer, self.api_key = profile, fleet, lb, api_key
        self._outputs(lb, api_key)

    def _scale_and_watch(self, profile: ServingProfile, fleet: ServingFleet, lb: InferenceLoadBalancer) -> None:
        """Scaling on the fleet's own signals, the wake door of a group that sleeps (with the ALB's 503s as the
        backstop), and the dashboard/alarms."""
        no_target_503 = lb.alb.metrics.http_code_elb(
            elbv2.HttpCodeElb.ELB_503_COUNT, period=Duration.minutes(1), statistic="Sum"
        )
        # Scaling policies, their alarms, scheduled actions and the warm pool act on the group: they follow it. What
        # only watches or wakes it names it (a fixed name, no reference), so CloudFormation creates it in the first
        # minutes beside the load balancer, and a refusal of any of it comes before the image build and the boot.
        self.scaling = FleetScaling(self, "Scaling", fleet=profile.fleet, asg=fleet.asg, no_target_503=no_target_503)
        named = autoscaling.AutoScalingGroup.from_auto_scaling_group_name(self, "GroupByName", fleet.group_name)
        self.wake_door = None
        if profile.fleet.wake_on_request:
            self.wake_door = WakeDoor(
                self, "WakeDoor", listener=lb.listener, servers=lb.target_group, asg=named, wake_s=profile.wake_s
            )
        self.monitoring = ServiceMonitoring(
            self, "Monitoring", name=self.stack_name, fleet=profile.fleet, has_gpu=profile.hardware.has_gpu,
            mtp=profile.mtp, asg=named, alb=lb.alb, target_group=lb.target_group,
            wake_answers=self.wake_door.answered if self.wake_door else None,
        )  # fmt: skip

    def _acknowledge(self) -> None:
        acknowledge(
            self,
            "CloudFormation-Validate::W3010",
            "Zones are pinned on purpose in cdk.context.json: no lookup at synth, and the user picks zones that offer "
            "the instance type.",
        )
        Aspects.of(self).add(CheckovAcknowledgements())

    def _deploy(
        self, image: ImageBuild, api_key: ApiKey, cache: ModelCache, log_group: logs.LogGroup
    ) -> DeploySettings:
        """The deploy-time values the boot script reads (CDK tokens, rendered untouched)."""
        return DeploySettings(
            region=self.region,
            stack_name=self.stack_name,
            image_uri=image.image_uri,
            registry=image.registry,
            api_key_secret_arn=api_key.secret.secret_arn,
            model_cache_url=cache.s3_url,
            log_group=log_group.log_group_name,
            metrics_namespace=names.NAMESPACE,
        )

    def _outputs(self, lb: InferenceLoadBalancer, api_key: ApiKey) -> None:
        CfnOutput(self, "EndpointUrl", value=f"{lb.url}/v1", description="OpenAI-compatible base URL (in the VPC)")
        CfnOutput(self, "ApiKeySecretArn", value=api_key.secret.secret_arn, description="Secrets Manager secret")
        CfnOutput(
            self,
            "CurlExample",
            description="Run from inside the VPC, e.g. an SSM session on an instance",
            value=(
                f'curl -s {lb.url}/v1/chat/completions -H "Authorization: Bearer $(aws secretsmanager '
                f"get-secret-value --region {Aws.REGION} --secret-id {api_key.secret.secret_arn} --query SecretString "
                "--output text)\" -H 'Content-Type: application/json' "
                f'-d \'{{"messages":[{{"role":"user","content":"你好"}}],"max_tokens":256}}\''
            ),
        )

    @property
    def availability_zones(self) -> list[str]:
        return self._azs
