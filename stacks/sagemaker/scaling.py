"""Target tracking on SageMaker's own concurrency signal against the profile's slots.

`ConcurrentRequestsPerModel` counts the requests a variant's model holds, queued ones and each stream until its
last token, every 10 s (high resolution): llama.cpp's busy plus deferred slots, measured by SageMaker itself, so it
works under network isolation and with no container metric at all. The predefined metric type
SageMakerVariantConcurrentRequestsPerModelHighResolution (Application Auto Scaling API Reference,
PredefinedMetricSpecification, https://docs.amazonaws.cn/autoscaling/application/APIReference/
API_PredefinedMetricSpecification.html; botocore 1.43.11 and CDK 2.275 list it). The target is the profile's
slots times fleet.target_busy_slot_ratio per instance, as on EC2.

For SageMaker, Application Auto Scaling acts through its service-linked role whatever RoleARN says ("Service-linked
roles for Application Auto Scaling", https://docs.amazonaws.cn/en_us/autoscaling/application/userguide/
application-auto-scaling-service-linked-roles.html): the target names that role instead of a new one that would
go unused; it is created on first use if the deployer may, and the pre-flight reads whether it exists.
"""

from __future__ import annotations

from aws_cdk import Duration, Stack
from aws_cdk import aws_applicationautoscaling as appscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_iam as iam
from constructs import Construct, IConstruct

from gguf_serve.container.metrics import names
from gguf_serve.container.sagemaker.emf import DIM_ENDPOINT, DIM_VARIANT
from stacks.errors import PropsError
from stacks.options import SAGEMAKER_SCALING_METRICS

# A scale-in stops an instance with SIGTERM and SIGKILL 30 s later: a stream still running then is cut. A long
# cooldown keeps scale-ins rare; the cut-streams alarm counts any (stacks/sagemaker/monitoring.py).
SCALE_IN_COOLDOWN = Duration.minutes(15)
SCALE_OUT_COOLDOWN = Duration.minutes(1)
SERVICE_LINKED_ROLE_NAME = "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"
SERVICE_LINKED_ROLE = f"aws-service-role/sagemaker.application-autoscaling.amazonaws.com/{SERVICE_LINKED_ROLE_NAME}"


class EndpointScaling(Construct):
    """Exposes `target` (the scalable target)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        endpoint_name: str,
        variant_name: str,
        endpoint: IConstruct,
        min_instances: int,
        max_instances: int,
        target_concurrency: float,
        target_busy_percent: float = 70.0,
        metric: str = "concurrency",
    ) -> None:
        """
        endpoint_name, variant_name: the variant to scale; endpoint: the CfnEndpoint the target waits for.
        min_instances, max_instances: the variant's instance count bounds (fleet.min_capacity, max_capacity), 1 up.
        target_concurrency: concurrent requests per instance to hold (slots x target_busy_slot_ratio), above 0.
        target_busy_percent: the busy-slot share to hold with metric "slots" (target_busy_slot_ratio x 100).
        metric: "concurrency" (SageMaker's high-resolution ConcurrentRequestsPerModel, default) or "slots" (the
            container's SlotsBusyRatio from its log, -c sagemakerScalingMetric=slots: where the high-resolution
            predefined metric is refused).
        """
        if metric not in SAGEMAKER_SCALING_METRICS:
            raise PropsError(f"endpoint scaling: metric {metric!r}; use one of {', '.join(SAGEMAKER_SCALING_METRICS)}")
        if not 1 <= min_instances <= max_instances:
            raise PropsError(f"endpoint scaling: need 1 <= min {min_instances} <= max {max_instances} instances")
        if not target_concurrency > 0:
            raise PropsError(f"endpoint scaling: target_concurrency {target_concurrency} must be above 0")
        super().__init__(scope, construct_id)
        role_arn = Stack.of(self).format_arn(
            service="iam", region="", resource="role", resource_name=SERVICE_LINKED_ROLE
        )
        self.target = appscaling.ScalableTarget(
            self,
            "Target",
            service_namespace=appscaling.ServiceNamespace.SAGEMAKER,
            resource_id=f"endpoint/{endpoint_name}/variant/{variant_name}",
            scalable_dimension="sagemaker:variant:DesiredInstanceCount",
            min_capacity=min_instances,
            max_capacity=max_instances,
            role=iam.Role.from_role_arn(self, "ServiceLinkedRole", role_arn, mutable=False),
        )
        self.target.node.add_dependency(endpoint)
        if metric == "concurrency":
            self.target.scale_to_track_metric(
                "ConcurrentRequests",
                target_value=target_concurrency,
                predefined_metric=appscaling.PredefinedMetric.SAGEMAKER_VARIANT_CONCURRENT_REQUESTS_PER_MODEL_HIGH_RESOLUTION,
                scale_in_cooldown=SCALE_IN_COOLDOWN,
                scale_out_cooldown=SCALE_OUT_COOLDOWN,
            )
        else:
            # The container's own gauge (gguf_serve/container/sagemaker/emf.py): the variant's mean busy-slot share,
            # a standard-resolution metric (one datum per instance a minute), as on EC2.
            busy = cloudwatch.Metric(
                namespace=names.NAMESPACE, metric_name=names.SLOTS_BUSY_RATIO, statistic="Average",
                dimensions_map={DIM_ENDPOINT: endpoint_name, DIM_VARIANT: variant_name}, period=Duration.minutes(1),
            )  # fmt: skip
            self.target.scale_to_track_metric(
                "BusySlots",
                target_value=target_busy_percent,
                custom_metric=busy,
                scale_in_cooldown=SCALE_IN_COOLDOWN,
                scale_out_cooldown=SCALE_OUT_COOLDOWN,
            )
