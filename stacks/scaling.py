"""Scale on llama.cpp's own load signals (busy slots, queued requests) and the hop's shed requests, with a warm pool
of loaded instances."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from catalog import ServingProfile
from fleetmetrics import names


def group_metric(asg: autoscaling.AutoScalingGroup, metric_name: str, statistic: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=names.NAMESPACE,
        metric_name=metric_name,
        dimensions_map={names.DIM_GROUP: asg.auto_scaling_group_name},
        statistic=statistic,
        period=Duration.minutes(1),
    )


class FleetScaling(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, profile: ServingProfile, asg: autoscaling.AutoScalingGroup
    ) -> None:
        super().__init__(scope, construct_id)
        fleet = profile.fleet
        warmup = Duration.seconds(fleet.model_load_s)
        self.busy_slots = asg.scale_to_track_metric(
            "BusySlots",
            metric=group_metric(asg, names.SLOTS_BUSY_RATIO, "Average"),
            target_value=fleet.target_busy_slot_ratio * 100,
            disable_scale_in=False,
            estimated_instance_warmup=warmup,
        )
        # Target tracking reacts slowly to a queue; a step policy adds capacity as soon as requests wait.
        self.deferred = asg.scale_on_metric(
            "DeferredRequests",
            metric=group_metric(asg, names.REQUESTS_DEFERRED, "Maximum"),
            scaling_steps=[
                autoscaling.ScalingInterval(upper=0, change=0),
                autoscaling.ScalingInterval(lower=fleet.deferred_scale_out, change=1),
                autoscaling.ScalingInterval(lower=fleet.deferred_scale_out * 4, change=2),
            ],
            adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            evaluation_periods=2,
            estimated_instance_warmup=warmup,
        )
        # The hop answers 429 past slots * (1 + queue_per_slot): the deferred queue stops growing there, so a shed
        # request is the overload signal. One minute with any shed adds an instance; many add two.
        self.shed = asg.scale_on_metric(
            "ShedRequests",
            metric=group_metric(asg, names.REQUESTS_SHED, "Sum"),
            scaling_steps=[
                autoscaling.ScalingInterval(upper=0, change=0),
                autoscaling.ScalingInterval(lower=1, change=1),
                autoscaling.ScalingInterval(lower=fleet.shed_scale_out_many, change=2),
            ],
            adjustment_type=autoscaling.AdjustmentType.CHANGE_IN_CAPACITY,
            evaluation_periods=1,
            estimated_instance_warmup=warmup,
        )
        if fleet.off_hours is not None:
            stop, start = fleet.off_hours
            for name, hour, low in (("OffHours", stop, 0), ("WorkHours", start, fleet.min_capacity)):
                asg.scale_on_schedule(
                    name,
                    schedule=autoscaling.Schedule.cron(minute="0", hour=str(hour), week_day="MON-FRI"),
                    time_zone="Asia/Shanghai",
                    min_capacity=low,
                    max_capacity=0 if low == 0 else fleet.max_capacity,
                )
        if fleet.warm_pool_size:
            self.warm_pool = asg.add_warm_pool(
                min_size=fleet.warm_pool_size,
                pool_state=autoscaling.PoolState.STOPPED,  # Hibernated is not available in China
                reuse_on_scale_in=True,
            )
