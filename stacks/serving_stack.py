"""One deployable llama.cpp service: network, model cache, API key, image, fleet and load balancer."""

from __future__ import annotations

from aws_cdk import Aspects, Aws, CfnOutput, Duration, RemovalPolicy, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_logs as logs
from constructs import Construct

from gguf_serve.container.metrics import names
from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.checkov import CheckovAcknowledgements
from stacks.errors import PropsError
from stacks.fleet import ServingFleet
from stacks.fleet_cost import cost_basis
from stacks.image_build import ImageBuild
from stacks.load_balancer import InferenceLoadBalancer
from stacks.model_cache import ModelCache
from stacks.monitoring import ServiceMonitoring
from stacks.nag import acknowledge
from stacks.network import ServingNetwork
from stacks.plan import ServicePlan
from stacks.scaling import FleetScaling
from stacks.shared_endpoint import STACK_NAME as SHARED_STACK
from stacks.shared_endpoint import SharedEndpointStack, strong_references
from stacks.shared_fleet import SharedEndpointFleet
from stacks.wake_door import WakeDoor
from userdata import DeploySettings, InstanceSpec


class ServingStack(Stack):
    """One profile's service: it composes the constructs and wires them (grants, dependencies, outputs)."""

    def __init__(
        self, scope: Construct, construct_id: str, *, plan: ServicePlan, endpoint: SharedEndpointStack | None = None,
        **kwargs,
    ) -> None:  # fmt: skip
        """plan: the stack as it deploys (stacks/plan.py): its profile, and the deploy options resolved against it.
        endpoint: the shared endpoint this stack's fleet is behind (-c sharedEndpoint), whose VPC, load balancer and
        API key it uses; None: its own."""
        profile = plan.profile
        if profile is None:
            raise PropsError(f"ServingStack {construct_id}: its model has no lock entry; build an empty stack instead")
        super().__init__(scope, construct_id, description=profile.description, **kwargs)
        if endpoint:
            strong_references(self)
        self._azs = list(plan.zones)
        self._acknowledge()
        f, options = profile.fleet, plan.options
        vpc = endpoint.vpc if endpoint else ServingNetwork(self, "Network", settings=f.network).vpc
        access_logs = AccessLogs(self, "AccessLogs")
        cache = ModelCache(self, "ModelCache", access_logs=access_logs.bucket)
        api_key = endpoint.api_key if endpoint else ApiKey(self, "ApiKey")
        image = ImageBuild(
            self, "Image", target=profile.image, build_args=options.image_build_args,
            arm64_builder=options.arm64_builder, debian_mirrors=options.debian_mirrors,
        )  # fmt: skip
        log_group = logs.LogGroup(
            self, "ServerLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
        )
        fleet = ServingFleet(
            self, "Fleet", hardware=profile.hardware, capacity=plan.capacity, volume=f.volume, spot=plan.spot,
            instance=InstanceSpec.of(profile, endpoint.routed(construct_id) if endpoint else ()),
            deploy=self._deploy(image, api_key, cache, log_group, endpoint), image_tag=image.image_tag,
            root_volume_gib=profile.root_volume_gib, boot_budget_s=profile.boot_budget_s, vpc=vpc,
        )  # fmt: skip
        fleet.asg.node.add_dependency(image.build)  # instances boot only once the image is in ECR
        fleet.allow_instances(secret=api_key.secret, cache=cache, repository=image.repository, log_group=log_group)
        lb: InferenceLoadBalancer | SharedEndpointFleet
        if endpoint:
            lb = SharedEndpointFleet(self, "SharedEndpoint", endpoint=endpoint, fleet=fleet, settings=f.load_balancer)
        else:
            lb = InferenceLoadBalancer(
                self, "LoadBalancer", vpc=vpc, vpc_cidr=f.network.vpc_cidr, access_logs=access_logs.bucket,
                targets=[fleet.asg], target_port=fleet.port, settings=f.load_balancer,
                allowed_cidrs=options.allowed_cidrs, certificate_arn=options.certificate_arn,
            )  # fmt: skip
        assert lb.target_group is not None
        self.target_group = lb.target_group
        self._scale_and_watch(plan, fleet, lb, api_key)
        self.fleet, self.load_balancer, self.api_key = fleet, lb, api_key
        self._outputs(lb, api_key, endpoint.models[construct_id] if endpoint else ())

    def _scale_and_watch(
        self, plan: ServicePlan, fleet: ServingFleet, lb: InferenceLoadBalancer | SharedEndpointFleet, api_key: ApiKey
    ) -> None:
        """Scaling on the fleet's own signals, the wake door of a group that sleeps (with the ALB's 503s as the
        backstop), and the dashboard/alarms."""
        f, options = plan.fleet, plan.options
        no_target_503 = lb.alb.metrics.http_code_elb(
            elbv2.HttpCodeElb.ELB_503_COUNT, period=Duration.minutes(1), statistic="Sum"
        )
        # Scaling policies, their alarms, scheduled actions and the warm pool act on the group: they follow it. What
        # only watches or wakes it names it (a fixed name, no reference), so CloudFormation creates it in the first
        # minutes beside the load balancer, and a refusal of any of it comes before the image build and the boot.
        self.scaling = FleetScaling(
            self, "Scaling", capacity=plan.capacity, settings=f.scaling, warmup_s=f.boot.model_load_s,
            off_hours=options.off_hours, wake_on_request=options.wake_on_request, asg=fleet.asg,
            no_target_503=no_target_503,
        )  # fmt: skip
        named = autoscaling.AutoScalingGroup.from_auto_scaling_group_name(self, "GroupByName", fleet.group_name)
        self.wake_door = None
        if options.wake_on_request:
            self.wake_door = WakeDoor(
                self, "WakeDoor", listener=lb.listener, servers=lb.target_group, asg=named, wake_s=plan.wake_s,
                api_key=api_key.secret,
            )  # fmt: skip
        self.monitoring = ServiceMonitoring(
            self, "Monitoring", name=self.stack_name, alarms=f.alarms, sleeps=plan.sleeps,
            drain_deadline_s=fleet.drain_deadline_s, has_gpu=plan.hardware.has_gpu, mtp=plan.profile.mtp,
            asg=named, alb=lb.alb, target_group=lb.target_group,
            wake_answers=self.wake_door.answered if self.wake_door else None,
            cost=cost_basis(plan.profile, plan.hardware, spot=plan.spot),
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
        self, image: ImageBuild, api_key: ApiKey, cache: ModelCache, log_group: logs.LogGroup,
        endpoint: SharedEndpointStack | None,
    ) -> DeploySettings:  # fmt: skip
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
            route_url=endpoint.load_balancer.route_url if endpoint else "",
        )

    def _outputs(
        self, lb: InferenceLoadBalancer | SharedEndpointFleet, api_key: ApiKey, shared_names: tuple[str, ...]
    ) -> None:  # fmt: skip
        if shared_names:  # the URL and the key are the shared stack's outputs (an output may not re-export an import)
            CfnOutput(self, "ModelNames", value=", ".join(shared_names),
                      description="the model names this fleet answers to at the shared endpoint")  # fmt: skip
            CfnOutput(self, "Endpoint", value=f"{SHARED_STACK}: EndpointUrl, ApiKeySecretArn",
                      description="behind the shared endpoint: its URL and key are that stack's outputs")  # fmt: skip
            return
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
