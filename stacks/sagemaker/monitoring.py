"""The endpoint's dashboard and alarms, like the EC2 stacks' (stacks/monitoring.py), from three sources:

- SageMaker's own invocation metrics (AWS/SageMaker: Invocations, Invocation5XXErrors, ModelLatency,
  ConcurrentRequestsPerModel) and instance metrics (/aws/sagemaker/Endpoints: CPU, memory, disk, GPU), by
  EndpointName and VariantName ("Amazon SageMaker AI metrics in Amazon CloudWatch",
  https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/monitoring-cloudwatch.html);
- the container's EMF lines (gguf_serve/container/sagemaker/emf.py): slots, token rates, the hop's latency
  distributions, drains, under the EC2 stacks' namespace with the same two dimensions.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from gguf_serve.container.metrics import names
from gguf_serve.container.sagemaker.emf import DIM_ENDPOINT, DIM_VARIANT
from gguf_serve.container.sagemaker.emf import INTERVAL_S as EMF_INTERVAL_S
from stacks.fleet_cost import CostBasis, cost_widgets
from stacks.monitoring import TTFT_P95_ALARM_S

FIVE_MIN = Duration.minutes(5)
SAGEMAKER = "AWS/SageMaker"
INSTANCES = "/aws/sagemaker/Endpoints"


class EndpointMonitoring(Construct):
    """Exposes the alarms (`error_rate`, `backlog`, `streams_cut`, `ttft_p95`, `silent`) and `dashboard`."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        name: str,
        endpoint_name: str,
        variant_name: str,
        deferred_alarm: int,
        has_gpu: bool,
        mtp: bool,
        cost: CostBasis | None = None,
        cost_multiple: float = 0.0,
    ) -> None:
        """
        name: the stack's name: it starts every alarm description and names the dashboard (`<name>-llama`).
        endpoint_name, variant_name: the metrics' dimensions.
        deferred_alarm: queued requests, sustained 5 minutes, that page someone (fleet.deferred_alarm), 1 up.
        has_gpu: the GPU's TTFT threshold and GPU widgets; mtp: the draft-acceptance widget.
        cost, cost_multiple: the ml type's price and the full-load figure (stacks/fleet_cost.py), the alarm's multiple.
        """
        if not name or not endpoint_name or deferred_alarm < 1:
            raise ValueError("EndpointMonitoring: name and endpoint_name must be set, deferred_alarm at least 1")
        super().__init__(scope, construct_id)
        dims = {DIM_ENDPOINT: endpoint_name, DIM_VARIANT: variant_name}

        def metric(namespace: str, metric_name: str, statistic: str, **kw) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace=namespace, metric_name=metric_name, dimensions_map=dims, statistic=statistic,
                period=kw.pop("period", Duration.minutes(1)), **kw,
            )  # fmt: skip

        self._metric = metric
        invocations = metric(SAGEMAKER, "Invocations", "Sum", period=FIVE_MIN)
        errors = metric(SAGEMAKER, "Invocation5XXErrors", "Sum", period=FIVE_MIN)
        error_rate = cloudwatch.MathExpression(
            expression="IF(invocations > 0, 100 * errors / invocations, 0)",
            using_metrics={"errors": errors, "invocations": invocations},
            label="5xx %",
            period=FIVE_MIN,
        )
        self.error_rate = _alarm(
            self, "Invocation5xxRate", error_rate, 5, 2, f"{name}: more than 5% of invocations failed"
        )
        self.backlog = _alarm(
            self, "DeferredBacklog", metric(names.NAMESPACE, names.REQUESTS_DEFERRED, "Maximum", period=FIVE_MIN),
            deferred_alarm, 1, f"{name}: requests queue in llama-server; scaling is not keeping up", at_least=True,
        )  # fmt: skip
        cut = metric(names.NAMESPACE, names.DRAIN_STREAMS_CUT, "Sum", period=FIVE_MIN)
        self.streams_cut = _alarm(
            self, "DrainStreamsCut", cut, 1, 1,
            f"{name}: streams were still running when SageMaker stopped a container (scale-in or update: SIGKILL "
            "30 s after SIGTERM); clients saw a cut answer", at_least=True,
        )  # fmt: skip
        ttft_limit = TTFT_P95_ALARM_S["gpu" if has_gpu else "cpu"]
        self.ttft_p95 = _alarm(
            self, "TimeToFirstTokenP95", metric(names.NAMESPACE, names.TTFT, "p95", period=FIVE_MIN), ttft_limit, 3,
            f"{name}: P95 time to first token above {ttft_limit:g} s for 15 minutes (queueing or long prompts)",
        )  # fmt: skip
        # Every serving container writes its slot line each minute: none for 15 minutes means no container is up
        # (or its metrics do not reach CloudWatch).
        self.silent = metric(names.NAMESPACE, names.SCRAPE_FAILED, "SampleCount", period=FIVE_MIN).create_alarm(
            self,
            "NoServingContainer",
            threshold=1,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=3,
            treat_missing_data=cloudwatch.TreatMissingData.BREACHING,
            alarm_description=f"{name}: no container has written its metrics for 15 minutes",
        )
        self.cost_widgets: list[cloudwatch.IWidget] = []
        self.cost_per_token: cloudwatch.Alarm | None = None
        if cost is not None:
            # Instances counted by the container's own datums: each publishes busy slots once per EMF interval.
            busy = metric(names.NAMESPACE, names.SLOTS_BUSY_RATIO, "Average")
            self.cost_widgets, self.cost_per_token = cost_widgets(
                self, name=name, basis=cost, units=busy, tokens=metric(names.NAMESPACE, names.OUTPUT_TOKENS, "Sum"),
                busy=busy, alarm_multiple=cost_multiple, seconds_per_sample=EMF_INTERVAL_S,
            )  # fmt: skip
        self._dashboard(name, has_gpu=has_gpu, mtp=mtp, invocations=invocations, errors=errors, cut=cut)

    def _dashboard(self, name: str, *, has_gpu: bool, mtp: bool, invocations, errors, cut) -> None:
        metric = self._metric

        def ours(metric_name: str, statistic: str, **kw) -> cloudwatch.Metric:
            return metric(names.NAMESPACE, metric_name, statistic, **kw)

        def percentiles(metric_name: str) -> list[cloudwatch.IMetric]:
            return [ours(metric_name, p, label=f"{metric_name} {p}") for p in ("p50", "p95", "p99")]

        widgets: list[cloudwatch.IWidget] = [
            _graph("Generated tokens/s (per instance, average)", [ours(names.GENERATED_TPS, "Average")]),
            _graph(
                "Concurrent requests per model (SageMaker, scaling signal) / processing / deferred",
                [
                    metric(SAGEMAKER, "ConcurrentRequestsPerModel", "Maximum", label="concurrent (SageMaker)"),
                    ours(names.REQUESTS_PROCESSING, "Sum"),
                    ours(names.REQUESTS_DEFERRED, "Sum"),
                ],
            ),
            _graph("Busy slots %", [ours(names.SLOTS_BUSY_RATIO, "Average")]),
            _graph("Time to first token, s (variant percentiles)", percentiles(names.TTFT)),
            _graph("Inter-token latency, s (variant percentiles)", percentiles(names.INTER_TOKEN_LATENCY)),
            _graph("Queue wait, s (variant percentiles)", percentiles(names.QUEUE_WAIT)),
            _graph(
                "Model latency, microseconds (SageMaker: the container's answer)",
                [metric(SAGEMAKER, "ModelLatency", p, label=p) for p in ("p50", "p95", "p99")],
            ),
            _graph("Invocations / 5xx errors", [invocations, errors]),
            _graph(
                "Drains: streams finished / cut, requests answered 503 (scale-in, updates)",
                [
                    ours(names.DRAINS, "Sum", period=FIVE_MIN, label="drains"),
                    ours(names.DRAIN_STREAMS_FINISHED, "Sum", period=FIVE_MIN, label="finished"),
                    cut.with_(label="cut"),
                    ours(names.DRAIN_REFUSED, "Sum", period=FIVE_MIN, label="refused 503"),
                ],
            ),
            _graph(
                "Instances: CPU % / memory % / disk %",
                [metric(INSTANCES, m, "Average") for m in ("CPUUtilization", "MemoryUtilization", "DiskUtilization")],
            ),
            cloudwatch.AlarmStatusWidget(
                title="Alarms",
                alarms=[
                    self.error_rate,
                    self.backlog,
                    self.streams_cut,
                    self.ttft_p95,
                    self.silent,
                    *([self.cost_per_token] if self.cost_per_token else []),
                ],
                width=12,
            ),
        ]
        widgets[1:1] = self.cost_widgets
        if mtp:
            widgets.insert(1, _graph("MTP draft acceptance %", [ours(names.DRAFT_ACCEPTANCE, "Average")]))
        if has_gpu:
            widgets.append(
                _graph("GPU % / GPU memory %", [metric(INSTANCES, m, "Average") for m in ("GPUUtilization",
                                                                                         "GPUMemoryUtilization")])
            )  # fmt: skip
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name}-llama")
        for i in range(0, len(widgets), 2):
            self.dashboard.add_widgets(*widgets[i : i + 2])


def _alarm(
    scope: Construct, construct_id: str, metric: cloudwatch.IMetric, threshold: float, periods: int, description: str,
    *, at_least: bool = False,
) -> cloudwatch.Alarm:  # fmt: skip
    return cloudwatch.Alarm(
        scope,
        construct_id,
        metric=metric,
        threshold=threshold,
        comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD
        if at_least
        else cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
        evaluation_periods=periods,
        treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        alarm_description=description,
    )


def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, left=metrics, width=12, height=6)
