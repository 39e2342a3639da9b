"""One dashboard per stack and the alarms an operator needs: no healthy host, 5xx rate, queued requests, slow first
tokens (P95 TTFT from the timing hop's distributions, computed by CloudWatch across the fleet), streams cut by a
drain (a Spot interruption or a scale-in that ran out of time)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from constructs import Construct

from gguf_serve.catalog.fleet import AlarmSettings
from gguf_serve.container.metrics import names
from stacks.errors import PropsError
from stacks.fleet_cost import CostBasis, cost_widgets
from stacks.scaling import group_metric, group_size

FIVE_MIN = Duration.minutes(5)
# P95 time to first token that pages: a GPU answers a 2k-token prompt in about a second; the CPU stacks take tens
# of seconds for long prompts, so their threshold is wider. Same shape as
# gguf_serve/local/workstation/observability/rules/alerts.yml.
TTFT_P95_ALARM_S = {"gpu": 10.0, "cpu": 30.0}
_Metric = cloudwatch.Metric | cloudwatch.MathExpression


class ServiceMonitoring(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        alarms: AlarmSettings,
        sleeps: bool = False,
        drain_deadline_s: int,
        has_gpu: bool,
        mtp: bool,
        asg: autoscaling.IAutoScalingGroup,
        alb: elbv2.ApplicationLoadBalancer,
        target_group: elbv2.ApplicationTargetGroup,
        wake_answers: cloudwatch.IMetric | None = None,
        cost: CostBasis | None = None,
    ) -> None:
        """
        name: the stack's name, which starts every alarm description and names the dashboard (`<name>-llama`).
        alarms: the backlog alarm's threshold (deferred_alarm).
        sleeps: the group is at zero at times (off hours, min capacity 0): no healthy host alarms only while
            instances are in service; default False.
        drain_deadline_s: the longest a leaving instance serves its streams; the cut-streams alarm cites it.
        has_gpu: the GPU's TTFT threshold and GPU widgets; mtp: the draft-acceptance widget.
        asg, alb, target_group: whose metrics are watched.
        wake_answers: requests the wake door answered (stacks/wake_door.py), graphed with the wake-ups.
        cost: the profile's price and full-load figure (stacks/fleet_cost.py): ¥ per million output tokens served,
            and with alarms.cost_multiple an alarm on a day's.
        """
        if not name:
            raise PropsError("ServiceMonitoring: name is empty; pass the stack's name")
        super().__init__(scope, construct_id)
        tg = target_group.metrics
        healthy: _Metric = tg.healthy_host_count(period=Duration.minutes(1), statistic="Minimum")
        if sleeps:
            # A group that sleeps has no healthy host by design: alarm only when instances are in service (past
            # their launch hook, so /health was 200) and none passes the load balancer's checks.
            healthy = cloudwatch.MathExpression(
                expression="IF(FILL(serving, 0) >= 1, FILL(healthy, 0), 1)",
                using_metrics={"serving": group_size(asg, "GroupInServiceInstances"), "healthy": healthy},
                label="healthy hosts (1 while the group is at zero)",
                period=Duration.minutes(1),
            )
        errors_5xx = tg.http_code_target(elbv2.HttpCodeTarget.TARGET_5XX_COUNT, period=FIVE_MIN, statistic="Sum")
        requests = tg.request_count(period=FIVE_MIN, statistic="Sum")
        error_rate = cloudwatch.MathExpression(
            expression="IF(requests > 0, 100 * errors / requests, 0)",
            using_metrics={"errors": errors_5xx, "requests": requests},
            label="5xx %",
            period=FIVE_MIN,
        )
        deferred = group_metric(asg, names.REQUESTS_DEFERRED, "Maximum")
        # The hop's drain (gguf_serve/container/hop/drain.py) puts one datum per drain; no drain, no data (not
        # breaching).
        cut = group_metric(asg, names.DRAIN_STREAMS_CUT, "Sum").with_(period=FIVE_MIN)
        self._alarms(
            name=name, alarms=alarms, drain_deadline_s=drain_deadline_s, has_gpu=has_gpu, asg=asg, healthy=healthy,
            error_rate=error_rate, deferred=deferred, cut=cut,
        )  # fmt: skip
        self.cost_widgets: list[cloudwatch.IWidget] = []
        self.cost_per_token: cloudwatch.Alarm | None = None
        if cost is not None:
            self.cost_widgets, self.cost_per_token = cost_widgets(
                self, name=name, basis=cost, units=group_size(asg, "GroupInServiceInstances"),
                tokens=group_metric(asg, names.OUTPUT_TOKENS, "Sum"),
                busy=group_metric(asg, names.SLOTS_BUSY_RATIO, "Average"), alarm_multiple=alarms.cost_multiple,
            )  # fmt: skip
        self._dashboard(
            name=name, mtp=mtp, has_gpu=has_gpu, asg=asg, alb=alb, tg=tg, healthy=healthy, errors_5xx=errors_5xx,
            cut=cut, wake_answers=wake_answers,
        )  # fmt: skip

    def _alarms(
        self, *, name: str, alarms: AlarmSettings, drain_deadline_s: int, has_gpu: bool,
        asg: autoscaling.IAutoScalingGroup,
        healthy: _Metric, error_rate: _Metric, deferred: _Metric, cut: _Metric,
    ) -> None:  # fmt: skip
        """No healthy host, 5xx rate, backlog, cut streams, slow first tokens."""
        self.no_healthy_hosts = healthy.create_alarm(
            self,
            "NoHealthyHosts",
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
            alarm_description=f"{name}: no instance passes /health",
        )
        self.error_rate = error_rate.create_alarm(
            self,
            "Http5xxRate",
            threshold=5,
            evaluation_periods=2,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{name}: more than 5% of requests answered 5xx",
        )
        self.backlog = deferred.with_(period=FIVE_MIN).create_alarm(
            self,
            "DeferredBacklog",
            threshold=alarms.deferred_alarm,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"{name}: requests queue in llama-server; scaling is not keeping up",
        )

        self.streams_cut = cut.create_alarm(
            self,
            "DrainStreamsCut",
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=(
                f"{name}: streams were still running when an instance left (a Spot interruption, or "
                f"a drain past its {drain_deadline_s} s deadline); clients saw a cut answer"
            ),
        )

        ttft_p95_limit = TTFT_P95_ALARM_S["gpu" if has_gpu else "cpu"]
        self.ttft_p95 = (
            group_metric(asg, names.TTFT, "p95")
            .with_(period=FIVE_MIN)
            .create_alarm(
                self,
                "TimeToFirstTokenP95",
                threshold=ttft_p95_limit,
                comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
                evaluation_periods=3,
                treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
                alarm_description=(
                    f"{name}: P95 time to first token above {ttft_p95_limit:g} s for 15 minutes "
                    "(queueing or long prompts; see QueueWait)"
                ),
            )
        )

    def _dashboard(
        self, *, name: str, mtp: bool, has_gpu: bool, asg: autoscaling.IAutoScalingGroup,
        alb: elbv2.ApplicationLoadBalancer, tg: elbv2.IApplicationTargetGroupMetrics,
        healthy: _Metric, errors_5xx: _Metric, cut: _Metric, wake_answers: cloudwatch.IMetric | None,
    ) -> None:  # fmt: skip
        """One dashboard, `<name>-llama`: throughput, latency percentiles, ALB, drains, wake-ups, alarms."""

        def percentiles(metric: str) -> list[cloudwatch.IMetric]:
            return [group_metric(asg, metric, p).with_(label=f"{metric} {p}") for p in ("p50", "p95", "p99")]

        latency = [
            tg.target_response_time(statistic=p, period=Duration.minutes(1), label=p) for p in ("p50", "p95", "p99")
        ]
        widgets: list[cloudwatch.IWidget] = [
            _graph(
                "Generated tokens/s (per instance, group average)", [group_metric(asg, names.GENERATED_TPS, "Average")]
            ),
            _graph(
                "Requests processing / deferred",
                [
                    group_metric(asg, names.REQUESTS_PROCESSING, "Sum"),
                    group_metric(asg, names.REQUESTS_DEFERRED, "Sum"),
                ],
            ),
            _graph("Busy slots %", [group_metric(asg, names.SLOTS_BUSY_RATIO, "Average")]),
            _graph("Time to first token, s (fleet percentiles)", percentiles(names.TTFT)),
            _graph("Inter-token latency, s (fleet percentiles)", percentiles(names.INTER_TOKEN_LATENCY)),
            _graph("Queue wait, s (fleet percentiles)", percentiles(names.QUEUE_WAIT)),
            _graph(
                "Decode tokens/s per request (p5 / p50)",
                [group_metric(asg, names.DECODE_TPS, p).with_(label=f"tok/s {p}") for p in ("p5", "p50")],
            ),
            _graph("ALB target response time", latency),
            _graph(
                "ALB 4xx / 5xx",
                [
                    tg.http_code_target(elbv2.HttpCodeTarget.TARGET_4XX_COUNT, period=FIVE_MIN, statistic="Sum"),
                    errors_5xx,
                    alb.metrics.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=FIVE_MIN, statistic="Sum"),
                ],
            ),
            _graph("Healthy hosts", [healthy]),
            _graph(
                "Drains: streams finished / cut, new requests answered 503 (Spot notices, scale-in, updates)",
                [
                    group_metric(asg, names.DRAINS, "Sum").with_(period=FIVE_MIN, label="drains"),
                    group_metric(asg, names.DRAIN_STREAMS_FINISHED, "Sum").with_(period=FIVE_MIN, label="finished"),
                    cut.with_(label="cut"),
                    group_metric(asg, names.DRAIN_REFUSED, "Sum").with_(period=FIVE_MIN, label="refused 503"),
                ],
            ),
            _graph(
                "Wake-ups: instances in service / desired, ALB 503s with no target, wake door answers",
                [
                    group_size(asg, "GroupInServiceInstances"),
                    group_size(asg, "GroupDesiredCapacity"),
                    # The ALB answers 503 itself when no target is registered or healthy (a group at zero): ELB
                    # User Guide, "HTTP 503: Service unavailable", docs.amazonaws.cn.
                    alb.metrics.http_code_elb(
                        elbv2.HttpCodeElb.ELB_503_COUNT, period=Duration.minutes(1), statistic="Sum"
                    ),
                    group_metric(asg, names.DRAIN_SECONDS, "Maximum").with_(label="longest drain, s"),
                    *([wake_answers] if wake_answers is not None else []),
                ],
            ),
            cloudwatch.AlarmStatusWidget(
                title="Alarms",
                alarms=[
                    self.no_healthy_hosts,
                    self.error_rate,
                    self.backlog,
                    self.ttft_p95,
                    self.streams_cut,
                    *([self.cost_per_token] if self.cost_per_token else []),
                ],
                width=12,
            ),
        ]
        widgets[1:1] = self.cost_widgets  # near the top: what the fleet's tokens cost, and the utilization behind it
        if mtp:
            widgets.insert(1, _graph("MTP draft acceptance %", [group_metric(asg, names.DRAFT_ACCEPTANCE, "Average")]))
        if has_gpu:
            widgets.append(
                _graph(
                    "GPU utilization % / memory used MiB",
                    # The CloudWatch agent's nvidia_gpu plugin publishes these under our namespace (boot script).
                    [
                        group_metric(asg, "nvidia_smi_utilization_gpu", "Average"),
                        group_metric(asg, "nvidia_smi_memory_used", "Average"),
                    ],
                )
            )
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name}-llama")
        for i in range(0, len(widgets), 2):
            self.dashboard.add_widgets(*widgets[i : i + 2])


def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, left=metrics, width=12, height=6)
