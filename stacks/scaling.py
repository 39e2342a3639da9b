"""Scale on llama.cpp's own load signals (busy slots, queued requests) and the hop's shed requests, with a warm pool
of loaded instances."""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import Duration
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as cloudwatch_actions
from constructs import Construct

from gguf_serve.catalog.fleet import Capacity, ScalingSettings
from gguf_serve.container.metrics import names
from stacks.errors import PropsError


def group_metric(asg: autoscaling.IAutoScalingGroup, metric_name: str, statistic: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=names.NAMESPACE,
        metric_name=metric_name,
        dimensions_map={names.DIM_GROUP: asg.auto_scaling_group_name},
        statistic=statistic,
        period=Duration.minutes(1),
    )


def group_size(asg: autoscaling.IAutoScalingGroup, metric_name: str) -> cloudwatch.Metric:
    """EC2 Auto Scaling's own group metrics (GroupInServiceInstances, GroupDesiredCapacity, ...; the group enables
    all of them: group_metrics in stacks/fleet.py), one-minute Maximum."""
    return cloudwatch.Metric(
        namespace="AWS/AutoScaling",
        metric_name=metric_name,
        dimensions_map={"AutoScalingGroupName": asg.auto_scaling_group_name},
        statistic="Maximum",
        period=Duration.minutes(1),
    )


def step_scale_out(
    asg: autoscaling.AutoScalingGroup,
    construct_id: str,
    *,
    metric: cloudwatch.Metric,
    steps: Sequence[tuple[float, int]],
    evaluation_periods: int,
    warmup: Duration,
) -> autoscaling.StepScalingAction:
    """Scale-out steps ((lower bound, instances to add), ascending) on one alarm at the first bound.

    The resources `asg.scale_on_metric` makes for the same steps, under the same construct ids (so the same logical
    ids and properties), without the `cooldown` it always hands its StepScalingAction: cooldowns apply to simple
    scaling policies only (EC2 Auto Scaling User Guide, "Step and simple scaling policies"), so CDK ignored it and
    warned that the setting is deprecated. The steps with no change below the first bound are implicit: no alarm.
    """
    scope = Construct(asg, construct_id)
    threshold = steps[0][0]
    statistic = metric.to_metric_config().metric_stat.statistic  # type: ignore[union-attr]
    action = autoscaling.StepScalingAction(
        scope,
        "UpperPolicy",
        auto_scaling_group=asg,
        adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
        estimated_instance_warmup=warmup,
        metric_aggregation_type=_AGGREGATION.get(statistic, autoscaling.MetricAggregationType.AVERAGE),
    )
    for i, (lower, change) in enumerate(steps):
        upper = steps[i + 1][0] - threshold if i + 1 < len(steps) else None
        action.add_adjustment(adjustment=change, lower_bound=lower - threshold, upper_bound=upper)
    alarm = cloudwatch.Alarm(
        scope,
        "UpperAlarm",
        metric=metric,
        alarm_description="Upper threshold scaling alarm",
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        evaluation_periods=evaluation_periods,
        threshold=threshold,
    )
    alarm.add_alarm_action(cloudwatch_actions.AutoScalingAction(action))
    return action


_AGGREGATION = {  # what scale_on_metric derives from the metric's statistic
    "Average": autoscaling.MetricAggregationType.AVERAGE,
    "Minimum": autoscaling.MetricAggregationType.MINIMUM,
    "Maximum": autoscaling.MetricAggregationType.MAXIMUM,
}


def wake_on_request_policy(
    asg: autoscaling.AutoScalingGroup, *, no_target_503: cloudwatch.IMetric, warmup: Duration
) -> autoscaling.StepScalingAction:
    """The wake door's backstop (stacks/wake_door.py): a group at zero goes to one instance when the ALB answered
    requests itself with 503 in the last minute, which happens only while the door's weights are wrong.

    With no registered target the ALB answers 503 and counts it in HTTPCode_ELB_503_Count (ELB User Guide for
    Application Load Balancers, "Troubleshoot your Application Load Balancers", HTTP 503, docs.amazonaws.cn);
    the group's own GroupInServiceInstances (group metrics are on: stacks/fleet.py) says it is at zero. Both are
    one-minute metrics, so the scale-out starts one to two minutes after the first refused request (not measured
    without an account). ExactCapacity 1: the alarm staying in ALARM while the instance boots changes nothing.
    Those clients get the ALB's bare 503, without Retry-After.
    """
    scope = Construct(asg, "WakeOnRequest")
    in_service = group_size(asg, "GroupInServiceInstances")
    asleep_and_asked = cloudwatch.MathExpression(
        expression="IF(FILL(served, 0) < 1 AND FILL(refused, 0) > 0, 1, 0)",
        using_metrics={"served": in_service, "refused": no_target_503},
        label="requests refused by the ALB while the group is at zero",
        period=Duration.minutes(1),
    )
    action = autoscaling.StepScalingAction(
        scope,
        "Policy",
        auto_scaling_group=asg,
        adjustment_type=autoscaling.AdjustmentType.EXACT_CAPACITY,
        estimated_instance_warmup=warmup,
    )
    action.add_adjustment(adjustment=1, lower_bound=0)
    alarm = asleep_and_asked.create_alarm(
        scope,
        "Alarm",
        threshold=1,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
        evaluation_periods=1,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        alarm_description="A request reached the load balancer while the group was at zero: scale to one",
    )
    alarm.add_alarm_action(cloudwatch_actions.AutoScalingAction(action))
    return action


class FleetScaling(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        capacity: Capacity,
        settings: ScalingSettings,
        warmup_s: int,
        off_hours: tuple[int, int] | None = None,
        wake_on_request: bool = False,
        asg: autoscaling.AutoScalingGroup,
        no_target_503: cloudwatch.IMetric | None = None,
    ) -> None:
        """
        capacity: the group's minimum (back at work hours), maximum (left while asleep with wake_on_request) and
            warm pool size (0: none).
        settings: the busy-slot target and the queue and shed thresholds that add instances.
        warmup_s: seconds a new instance's metrics stay out of the policies (the profile's model_load_s).
        off_hours: (stop, start) hours, weekdays, Asia/Shanghai: scale to zero in between (-c offHours); default
            None, always on.
        wake_on_request: a group at zero scales to one on the ALB's 503s (-c wakeOnRequest); default False.
        asg: the group scaled.
        no_target_503: the ALB's own 503s (HTTPCode_ELB_503_Count, Sum), which wake a group at zero; needed with
            wake_on_request.
        """
        if wake_on_request and no_target_503 is None:
            raise PropsError("FleetScaling: wake_on_request needs the load balancer's HTTPCode_ELB_503_Count")
        super().__init__(scope, construct_id)
        warmup = Duration.seconds(warmup_s)
        self.busy_slots = asg.scale_to_track_metric(
            "BusySlots",
            metric=group_metric(asg, names.SLOTS_BUSY_RATIO, "Average"),
            target_value=settings.target_busy_slot_ratio * 100,
            disable_scale_in=False,
            estimated_instance_warmup=warmup,
        )
        # Target tracking reacts slowly to a queue; a step policy adds capacity as soon as requests wait.
        self.deferred = step_scale_out(
            asg,
            "DeferredRequests",
            metric=group_metric(asg, names.REQUESTS_DEFERRED, "Maximum"),
            steps=[(settings.deferred_scale_out, 1), (settings.deferred_scale_out * 4, 2)],
            evaluation_periods=2,
            warmup=warmup,
        )
        # The hop answers 429 past slots * (1 + queue_per_slot): the deferred queue stops growing there, so a shed
        # request is the overload signal. One minute with any shed adds an instance; many add two.
        self.shed = step_scale_out(
            asg,
            "ShedRequests",
            metric=group_metric(asg, names.REQUESTS_SHED, "Sum"),
            steps=[(1, 1), (settings.shed_scale_out_many, 2)],
            evaluation_periods=1,
            warmup=warmup,
        )
        if off_hours is not None:
            stop, start = off_hours
            for name, hour, low in (("OffHours", stop, 0), ("WorkHours", start, capacity.min_capacity)):
                # Off hours hold the group at zero (max 0); with wake_on_request they only bring it to zero
                # (desired 0) and leave the maximum, so that a request can scale it out again.
                asleep = low == 0 and not wake_on_request
                asg.scale_on_schedule(
                    name,
                    schedule=autoscaling.Schedule.cron(minute="0", hour=str(hour), week_day="MON-FRI"),
                    time_zone="Asia/Shanghai",
                    min_capacity=low,
                    max_capacity=0 if asleep else capacity.max_capacity,
                    desired_capacity=0 if low == 0 and wake_on_request else None,
                )
        if wake_on_request:
            self.wake = wake_on_request_policy(asg, no_target_503=no_target_503, warmup=warmup)  # type: ignore[arg-type]
        if capacity.warm_pool_size:
            # The lifecycle hooks are part of the group (stacks/fleet.py), so a warm instance is held by the launch
            # hook from its first boot: it waits in Warmed:Pending:Wait until the ready unit completes it, rather
            # than being stopped as soon as it has launched (User Guide, "Use lifecycle hooks with a warm pool").
            self.warm_pool = asg.add_warm_pool(
                min_size=capacity.warm_pool_size,
                pool_state=autoscaling.PoolState.STOPPED,  # Hibernated is not available in China
                reuse_on_scale_in=True,
            )
