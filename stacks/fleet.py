"""The Auto Scaling group of llama-server instances: its boot script, launch template, role, security group."""

from __future__ import annotations

from dataclasses import asdict

from aws_cdk import ArnFormat, Duration, Stack, Token
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_secretsmanager as secretsmanager
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from gguf_serve.catalog.fleet import Capacity, RootVolume
from gguf_serve.catalog.hardware import Hardware
from gguf_serve.container.metrics import names
from gguf_serve.container.names import DRAIN_HEARTBEAT_S, DRAIN_HOOK, LIFECYCLE_HOOK
from stacks.errors import PropsError
from stacks.model_cache import ModelCache
from stacks.nag import account_in_finding, acknowledge, arn_of
from stacks.principals import ec2_principal
from userdata.render import BootSettings, DeploySettings, InstanceSpec, release_id, render_user_data

ROOT_DEVICE = "/dev/xvda"  # Amazon Linux 2023 and the AL2023 Deep Learning Base AMI
GROUP_LOGICAL_ID = "ServingGroup"  # fixed so user data can signal it before the group exists
READY_HOOK = LIFECYCLE_HOOK  # launch lifecycle hook, completed by the instance once /health answers 200
# gp3 volume size 1 GiB - 16 TiB (Amazon EBS User Guide, "General Purpose SSD volumes", gp3)
GP3_MAX_GIB = 16 * 1024
DRAIN_HEARTBEATS_MISSED = 3  # the drain hook times out (CONTINUE) after this many DRAIN_HEARTBEAT_S without one


def group_name(stack_name: str) -> str:
    """The group's name, fixed so that what only watches or wakes the group (alarms, dashboard, the wake door) names
    it without a reference, and CloudFormation creates them at once instead of after the first instance's signal.
    It matches the `<stack>-ServingGroup-*` pattern the instance role's lifecycle permissions name."""
    return f"{stack_name}-{GROUP_LOGICAL_ID}-serving"


def release_parameter_name(stack_name: str) -> str:
    """The SSM parameter holding the group's current release (user data reads it by this name)."""
    return f"/{stack_name}/serving-release"


class ServingFleet(Construct):
    """Secure EC2 defaults live here: IMDSv2 only, no SSH key (SSM), encrypted gp3, one narrow ingress rule."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        hardware: Hardware,
        capacity: Capacity,
        volume: RootVolume,
        spot: bool = False,
        instance: InstanceSpec,
        deploy: DeploySettings,
        image_tag: str,
        root_volume_gib: int,
        boot_budget_s: int,
        vpc: ec2.IVpc,
    ) -> None:
        """
        hardware: the instance type and AMI of every instance.
        capacity: the group's minimum, maximum, desired size, rolling-update batch and the Spot pools' extra instance
        types (the warm pool: FleetScaling).
        volume: the root volume's gp3 IOPS and throughput.
        spot: Spot above an On-Demand base, capacity-optimized, with capacity rebalancing (stacks/plan.py decides);
        default On-Demand.
        instance: what the boot script reads from the profile (port: the load balancer's target port; model_load_s:
        the group's instance warm-up; drain_deadline_s: the drain hook's deadline).
        deploy: the stack's deploy-time values the boot script reads (image, API key, model cache, log group).
        image_tag: the image the instances run; with the rendered script, the release id published so that
        warm-pool instances can compare.
        root_volume_gib: the encrypted gp3 root volume (AMI snapshot, model, image layers).
        boot_budget_s: worst-case launch to /health 200; the ready hook's timeout and the group's grace.
        """
        _check(port=instance.port, root_volume_gib=root_volume_gib, boot_budget_s=boot_budget_s, image_tag=image_tag)
        super().__init__(scope, construct_id)
        self.port = instance.port
        self.release = release_id(instance, image_tag)
        boot = BootSettings(
            **asdict(deploy),
            group_logical_id=GROUP_LOGICAL_ID,
            lifecycle_hook=READY_HOOK,
            release=self.release,
            release_parameter=release_parameter_name(deploy.stack_name),
        )
        user_data = ec2.UserData.custom(render_user_data(instance, boot))
        self.role = self._role()
        self.security_group = ec2.SecurityGroup(
            self, "SecurityGroup", vpc=vpc, allow_all_outbound=False, description="llama-server instances"
        )
        # ModelScope, ECR, Secrets Manager, CloudWatch and OS packages are all HTTPS.
        self.security_group.add_egress_rule(ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS out")
        self.launch_template = self._launch_template(hardware, volume, root_volume_gib, user_data)
        boot = Duration.seconds(boot_budget_s)
        self.release_parameter = ssm.StringParameter(
            self,
            "Release",
            parameter_name=release_parameter_name(Stack.of(self).stack_name),
            string_value=self.release,
            description="Release of the launch template; warm-pool instances of another release abandon their launch",
        )
        self.release_parameter.grant_read(self.role)
        self.group_name = group_name(Stack.of(self).stack_name)
        self.asg = self._group(vpc, capacity, spot, Duration.seconds(instance.model_load_s), boot)
        self._hooks(boot)
        self.drain_deadline_s = instance.drain_deadline_s
        self._grant_reporting(has_gpu=hardware.has_gpu)

    def _role(self) -> iam.Role:
        role = iam.Role(
            self,
            "InstanceRole",
            assumed_by=ec2_principal(self),
            managed_policies=[iam.ManagedPolicy.from_aws_managed_policy_name("AmazonSSMManagedInstanceCore")],
            description=f"llama-server instances of {Stack.of(self).stack_name}",
        )
        acknowledge(
            role,
            "AwsSolutions-IAM4[Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore]",
            "The AWS-maintained policy for Session Manager access, which replaces SSH keys.",
        )
        return role

    def _launch_template(
        self, hw: Hardware, volume: RootVolume, root_volume_gib: int, user_data: ec2.UserData
    ) -> ec2.LaunchTemplate:
        return ec2.LaunchTemplate(
            self,
            "LaunchTemplate",
            instance_type=ec2.InstanceType(hw.instance_type),
            machine_image=ec2.MachineImage.from_ssm_parameter(hw.ami_ssm_parameter),
            role=self.role,
            security_group=self.security_group,
            user_data=user_data,
            require_imdsv2=True,
            http_put_response_hop_limit=2,  # the container fetches the model with the instance role
            instance_metadata_tags=True,  # the boot script reads its group name from the instance tags
            block_devices=[
                ec2.BlockDevice(
                    device_name=ROOT_DEVICE,
                    volume=ec2.BlockDeviceVolume.ebs(
                        root_volume_gib,
                        volume_type=ec2.EbsDeviceVolumeType.GP3,
                        encrypted=True,
                        iops=volume.volume_iops,
                        throughput=volume.volume_throughput_mibps,
                        delete_on_termination=True,
                    ),
                )
            ],
            detailed_monitoring=True,
        )

    def _group(
        self, vpc: ec2.IVpc, capacity: Capacity, spot: bool, warmup: Duration, boot: Duration
    ) -> autoscaling.AutoScalingGroup:
        purchase: dict = {"launch_template": self.launch_template}
        if spot:
            # Spot above an On-Demand base of what a deploy or a rolling update waits for (min_capacity, plus the
            # instances an update launches beside them): an empty Spot pool never stalls the creation signal or an
            # update, only scale-out, across every listed type (capacity-optimized). A rebalance recommendation starts
            # a replacement before the interruption. No warm pool: PutWarmPool refuses a mixed instances policy.
            types = (self.launch_template.instance_type, *map(ec2.InstanceType, capacity.spot_instance_types))
            on_demand = capacity.on_demand_base()
            purchase = {
                "mixed_instances_policy": autoscaling.MixedInstancesPolicy(
                    launch_template=self.launch_template,
                    launch_template_overrides=[autoscaling.LaunchTemplateOverrides(instance_type=t) for t in types]
                    if capacity.spot_instance_types
                    else None,
                    instances_distribution=autoscaling.InstancesDistribution(
                        on_demand_base_capacity=on_demand,
                        on_demand_percentage_above_base_capacity=0,
                        spot_allocation_strategy=autoscaling.SpotAllocationStrategy.CAPACITY_OPTIMIZED,
                    ),
                ),
                "capacity_rebalance": True,
            }
        asg = autoscaling.AutoScalingGroup(
            self,
            "Group",
            auto_scaling_group_name=self.group_name,
            vpc=vpc,
            vpc_subnets=ec2.SubnetSelection(subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS),
            **purchase,
            min_capacity=capacity.min_capacity,
            max_capacity=capacity.max_capacity,
            desired_capacity=capacity.desired_capacity,
            health_checks=autoscaling.HealthChecks.with_additional_checks(
                additional_types=[autoscaling.AdditionalHealthCheckType.ELB], grace_period=boot
            ),
            default_instance_warmup=warmup,
            signals=autoscaling.Signals.wait_for_min_capacity(timeout=boot),
            update_policy=autoscaling.UpdatePolicy.rolling_update(
                max_batch_size=capacity.rolling_batch,
                min_instances_in_service=capacity.min_capacity,
                pause_time=boot,
                wait_on_resource_signals=True,
            ),
            group_metrics=[autoscaling.GroupMetrics.all()],
        )
        asg.node.default_child.override_logical_id(GROUP_LOGICAL_ID)  # type: ignore[union-attr]
        asg.node.add_dependency(self.release_parameter)  # updated before the rolling update starts
        if spot:
            acknowledge(
                asg,
                "AwsSolutions-EC26",
                "cdk-nag 3.0.2's EC26 reads only a group's LaunchTemplate and throws on a MixedInstancesPolicy; the "
                "launch template this policy uses has only encrypted volumes (tests/stacks/test_templates.py).",
            )
        acknowledge(
            asg,
            "AwsSolutions-AS3",
            "Scaling activity is visible in the group's activity history and CloudWatch group metrics.",
        )
        return asg

    def _hooks(self, boot: Duration) -> None:
        """Both hooks are in the group's own LifecycleHookSpecificationList: "lifecycle hooks to add to the Auto
        Scaling group before instances are launched" (CloudFormation Template Reference, AWS::AutoScaling::
        AutoScalingGroup, LifecycleHookSpecificationList; API Reference, CreateAutoScalingGroup). Separate
        AWS::AutoScaling::LifecycleHook resources are created only after the group, so its first instances (and
        a warm pool created in parallel) launched without them."""
        cfn_group: autoscaling.CfnAutoScalingGroup = self.asg.node.default_child  # type: ignore[assignment]
        cfn_group.lifecycle_hook_specification_list = [
            # Warm-pool and scale-out instances join only after /health answers 200 (the hook is released then).
            autoscaling.CfnAutoScalingGroup.LifecycleHookSpecificationProperty(
                lifecycle_hook_name=READY_HOOK,
                lifecycle_transition="autoscaling:EC2_INSTANCE_LAUNCHING",
                heartbeat_timeout=boot.to_seconds(),
                default_result="ABANDON",
            ),
            # Scale-in, rolling updates, capacity rebalancing and a return to the warm pool all pass this hook: the
            # hop sees autoscaling/target-lifecycle-state change in IMDS, answers new requests 503 + Retry-After,
            # records a heartbeat while its streams run and completes CONTINUE when they are done or at the drain
            # deadline (InstanceSpec.drain_deadline_s). The ALB deregisters the instance first (deregistration delay:
            # the backstop); a terminating instance waits in Terminating:Wait, one going back to the warm pool in
            # Warmed:Pending:Wait
            # (EC2 Auto Scaling User Guide, "How lifecycle hooks work" and "Use lifecycle hooks with a warm pool",
            # docs.amazonaws.cn).
            autoscaling.CfnAutoScalingGroup.LifecycleHookSpecificationProperty(
                lifecycle_hook_name=DRAIN_HOOK,
                lifecycle_transition="autoscaling:EC2_INSTANCE_TERMINATING",
                heartbeat_timeout=DRAIN_HEARTBEAT_S * DRAIN_HEARTBEATS_MISSED,
                default_result="CONTINUE",
            ),
        ]

    def _grant_reporting(self, *, has_gpu: bool) -> None:
        """Signal CloudFormation, complete and heartbeat its own hooks, put metrics; GPU: describe tags."""
        stack = Stack.of(self)
        # The instance reports itself healthy to CloudFormation and to its lifecycle hook.
        self.role.add_to_policy(
            iam.PolicyStatement(actions=["cloudformation:SignalResource"], resources=[stack.stack_id])
        )
        group_arn = stack.format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{stack.stack_name}-{GROUP_LOGICAL_ID}-*",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # Both take an autoScalingGroup resource (Service Authorization Reference, Amazon EC2 Auto Scaling).
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["autoscaling:CompleteLifecycleAction", "autoscaling:RecordLifecycleActionHeartbeat"],
                resources=[group_arn],
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": names.NAMESPACE}},
            )
        )
        if has_gpu:
            # The CloudWatch agent resolves ${aws:AutoScalingGroupName} (GPU metrics' dimension) with
            # ec2:DescribeTags, which has no resource-level permissions (CloudWatch agent guide, "Create IAM roles";
            # Service Authorization Reference for EC2).
            self.role.add_to_policy(iam.PolicyStatement(actions=["ec2:DescribeTags"], resources=["*"]))

    def allow_instances(
        self,
        *,
        secret: secretsmanager.ISecret,
        cache: ModelCache,
        repository: ecr.IRepository,
        log_group: logs.ILogGroup,
    ) -> None:
        """Least privilege: this stack's API key, the cache prefix, image pulls, its own log group."""
        stack = Stack.of(self)
        secret.grant_read(self.role)
        repository.grant_pull(self.role)
        log_group.grant_write(self.role)
        objects = cache.bucket.arn_for_objects(f"{cache.prefix}*")
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"], resources=[objects]
            )
        )
        self.role.add_to_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"],
                resources=[cache.bucket.bucket_arn],
                conditions={"StringLike": {"s3:prefix": [f"{cache.prefix}*"]}},
            )
        )
        acknowledge(
            self.role,
            "AwsSolutions-IAM5",
            "Model files under the cache prefix (names come from the profile); this stack's group by name pattern; "
            "GetAuthorizationToken and ec2:DescribeTags have no resource; PutMetricData is limited to our namespace by "
            "condition.",
            findings=[
                f"Resource::{arn_of(cache.bucket)}/{cache.prefix}*",
                "Resource::*",
                f"Resource::arn:{stack.partition}:autoscaling:{stack.region}:{account_in_finding(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/{stack.stack_name}-{GROUP_LOGICAL_ID}-*",
            ],
        )


def _check(*, port: int, root_volume_gib: int, boot_budget_s: int, image_tag: str) -> None:
    """The fleet's props, refused before anything is built, with what to change."""
    if not 1 <= port <= 65535:
        raise PropsError(f"ServingFleet: port {port} is not a TCP port; set the profile's server port to 1-65535")
    if not 1 <= root_volume_gib <= GP3_MAX_GIB:
        raise PropsError(
            f"ServingFleet: a {root_volume_gib} GiB root volume is outside gp3's 1-{GP3_MAX_GIB} GiB; "
            "lower the model size or the fleet's image_headroom_gib"
        )
    if boot_budget_s <= 0:
        raise PropsError(f"ServingFleet: boot budget {boot_budget_s} s must be positive (the profile's boot plan)")
    if not image_tag or Token.is_unresolved(image_tag):
        raise PropsError(
            f"ServingFleet: image tag {image_tag!r} is not a plain tag; pass ImageBuild.image_tag (the release id "
            "hashes it)"
        )
