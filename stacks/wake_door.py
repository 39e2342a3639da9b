"""The wake door: while a group that may sleep (wakeOnRequest) has no instance in service, requests go to a Lambda
function that answers 503 + Retry-After and sets the group to one instance, instead of the ALB's bare 503.

An ALB does not fall back from one target group to another when the first has no healthy target, so the
listener's one rule forwards to both, weighted: servers 1 and door 0 while an instance is in service, servers 0
and door 1 while none is. The function switches the weights itself (handlers/wake_door.py) on the group's
EventBridge events, on a schedule and on every request it answers.

Cost while asleep: one Lambda invocation per request and one per schedule tick (128 MB, well under a second),
no instance hours. Holding a request until an instance is up is not built: a Lambda response through an ALB is
buffered (1 MB at most) and cannot stream, so it would hold the client only to answer what Retry-After says now.

Sources (docs.amazonaws.cn): Lambda functions as ALB targets, their event and response shapes and the 1 MB
response limit: ELB User Guide for Application Load Balancers, "Lambda functions as targets"; a forward action's
target group weight may be 0-999: Elastic Load Balancing API Reference, TargetGroupTuple.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import ArnFormat, Aws, Duration, Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from aws_cdk import aws_elasticloadbalancingv2_targets as elb_targets
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as events_targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_secretsmanager as secretsmanager
from constructs import Construct

from gguf_serve.container.names import PRODUCT
from stacks import lambda_runtimes
from stacks.errors import PropsError
from stacks.nag import account_in_finding, acknowledge

HANDLER = Path(__file__).parent / "handlers" / "wake_door.py"
WOKEN_TAG = f"{PRODUCT}:woken-at"
RECONCILE_EVERY = Duration.minutes(5)
# The events EC2 Auto Scaling sends to EventBridge for a group's instances ("Amazon EC2 Auto Scaling event
# reference", EC2 Auto Scaling User Guide, docs.amazonaws.cn): in service, gone, and a termination that waits on
# the drain hook (the last instance's leaving is when requests must come here).
GROUP_EVENTS = ["EC2 Instance Launch Successful", "EC2 Instance Terminate Successful",
                "EC2 Instance-terminate Lifecycle Action"]  # fmt: skip
MAX_RETRY_AFTER_S = 3600  # a wake-up plan longer than an hour is a profile error, not a Retry-After


class WakeDoor(Construct):
    """Exposes `function`, `target_group` (the door's) and `answered` (requests it answered, a metric)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        listener: elbv2.ApplicationListener,
        servers: elbv2.ApplicationTargetGroup,
        asg: autoscaling.IAutoScalingGroup,
        wake_s: int,
        api_key: secretsmanager.ISecret,
    ) -> None:
        """
        listener: the load balancer's listener; the door adds the one rule every request matches.
        servers: the fleet's target group (weight 1 while an instance is in service).
        asg: the group the door wakes (desired 0 -> 1) and watches.
        wake_s: the profile's expected launch (or warm start) to /health 200: the first Retry-After.
        api_key: the secret llama-server's key is in: only a request with it wakes the group.
        """
        if not 1 <= wake_s <= MAX_RETRY_AFTER_S:
            raise PropsError(
                f"WakeDoor: a wake-up of {wake_s} s is outside 1-{MAX_RETRY_AFTER_S} s; check the profile's boot "
                "plan (gguf_serve/catalog/fleet.py) or leave wakeOnRequest off"
            )
        super().__init__(scope, construct_id)
        self.function = lambda_.Function(
            self,
            "Function",
            runtime=lambda_runtimes.PYTHON,
            handler="index.handler",
            code=lambda_.Code.from_inline(HANDLER.read_text()),
            timeout=Duration.seconds(90),  # a launch event waits up to 60 s for the target's health checks
            memory_size=128,
            description=f"Answers 503 + Retry-After and wakes {Stack.of(self).stack_name}'s group while it is at zero",
        )
        self.target_group = elbv2.ApplicationTargetGroup(
            self, "Door", targets=[elb_targets.LambdaTarget(self.function)]
        )
        # Only this account's load balancers may invoke it (the confused-deputy guard the ELB guide recommends,
        # "Lambda functions as targets": aws:SourceAccount); the target group's own ARN would make a cycle.
        for child in self.function.node.children:
            if isinstance(child, lambda_.CfnPermission) and child.principal == "elasticloadbalancing.amazonaws.com":
                child.source_account = Aws.ACCOUNT_ID
        self.rule = elbv2.ApplicationListenerRule(
            self,
            "Route",
            listener=listener,
            priority=1,
            conditions=[elbv2.ListenerCondition.path_patterns(["/*"])],
            action=elbv2.ListenerAction.weighted_forward(
                [
                    elbv2.WeightedTargetGroup(target_group=servers, weight=1),
                    elbv2.WeightedTargetGroup(target_group=self.target_group, weight=0),
                ]
            ),
        )
        # The function finds the rule and its own target group from the listener and the servers' target group:
        # naming either in its environment would make a cycle (rule -> door -> invoke permission -> function).
        env = {
            "GROUP_NAME": asg.auto_scaling_group_name,
            "LISTENER_ARN": listener.listener_arn,
            "SERVERS_TARGET_GROUP_ARN": servers.target_group_arn,
            "WAKE_S": str(wake_s),
            "WOKEN_TAG": WOKEN_TAG,
            "API_KEY_SECRET_ARN": api_key.secret_arn,
        }
        for key, value in env.items():
            self.function.add_environment(key, value)
        self._grant(asg)
        api_key.grant_read(self.function)  # the key check before anything wakes
        self._triggers(asg)
        self.answered = self.target_group.metrics.request_count(
            period=Duration.minutes(1), statistic="Sum", label="requests the wake door answered"
        )

    def _grant(self, asg: autoscaling.IAutoScalingGroup) -> None:
        stack = Stack.of(self)
        group_arn = stack.format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{asg.auto_scaling_group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )
        # Its own policy, not the function's default one: the function must not depend on the rule (the rule
        # depends on the door's target group, which depends on the function's invoke permission).
        # SetDesiredCapacity and CreateOrUpdateTags take an autoScalingGroup resource, ModifyRule a listener-rule;
        # the Describe actions of EC2 Auto Scaling and Elastic Load Balancing take none (Service Authorization
        # Reference).
        policy = iam.Policy(
            self,
            "Policy",
            roles=[self.function.role],  # type: ignore[list-item]
            statements=[
                iam.PolicyStatement(
                    actions=["autoscaling:SetDesiredCapacity", "autoscaling:CreateOrUpdateTags"],
                    resources=[group_arn],
                ),
                iam.PolicyStatement(
                    actions=["elasticloadbalancing:ModifyRule"], resources=[self.rule.listener_rule_arn]
                ),
                iam.PolicyStatement(
                    actions=[
                        "autoscaling:DescribeAutoScalingGroups",
                        "elasticloadbalancing:DescribeRules",
                        "elasticloadbalancing:DescribeTargetHealth",
                    ],
                    resources=["*"],
                ),
            ],
        )
        # The group by its fixed name (ServingFleet.group_name), or by a reference to it (<logical id>).
        child = asg.node.default_child
        group = f"<{stack.resolve(child.logical_id)}>" if child is not None else asg.auto_scaling_group_name  # type: ignore[attr-defined]
        acknowledge(
            policy,
            "AwsSolutions-IAM5",
            "The group by its name (the account-unique id in its ARN is unknown at synth); the Describe actions "
            "have no resource-level permissions.",
            findings=[
                "Resource::*",
                f"Resource::arn:{stack.partition}:autoscaling:{stack.region}:{account_in_finding(stack)}:"
                f"autoScalingGroup:*:autoScalingGroupName/{group}",
            ],
        )
        acknowledge(
            self.function,
            "AwsSolutions-IAM4",
            "Lambda basic execution role (CloudWatch Logs) for the wake door.",
            findings=["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
        )
        acknowledge(
            self.function,
            "AwsSolutions-L1",
            "Python 3.13 is supported in the China regions; 3.14 there is not verified by this project.",
        )

    def _triggers(self, asg: autoscaling.IAutoScalingGroup) -> None:
        target = events_targets.LambdaFunction(self.function, retry_attempts=2)
        events.Rule(
            self,
            "GroupEvents",
            description="Route requests to the servers or the wake door as the group's instances come and go",
            event_pattern=events.EventPattern(
                source=["aws.autoscaling"],
                detail_type=GROUP_EVENTS,
                detail={"AutoScalingGroupName": [asg.auto_scaling_group_name]},
            ),
            targets=[target],
        )
        events.Rule(
            self,
            "Reconcile",
            description="Put the wake door's routing right from the group's state (a lost event)",
            schedule=events.Schedule.rate(RECONCILE_EVERY),
            targets=[target],
        )
