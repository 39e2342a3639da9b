"""SharedEndpointStack's dashboard, `<name>-endpoint`: what only the shared load balancer sees. Each fleet behind it
keeps its own dashboard and alarms (its target group's traffic, latency, errors and cost, in its own stack); here are
the requests of every fleet together, the ALB's own 4xx (its fixed 404 `model_not_found` for a name no fleet serves on
the route listener among them) and 5xx (503: a fleet with no healthy instance), connections the ALB refused, and the
time to the first byte over all fleets.

Metric names and dimensions: "CloudWatch metrics for your Application Load Balancer" (ELB User Guide,
docs.amazonaws.cn): RequestCount, HTTPCode_ELB_4XX_Count, HTTPCode_ELB_5XX_Count, RejectedConnectionCount and
TargetResponseTime by LoadBalancer.
"""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_elasticloadbalancingv2 as elbv2
from constructs import Construct

MINUTE = Duration.minutes(1)


class SharedEndpointMonitoring(Construct):
    """Exposes `dashboard`."""

    def __init__(self, scope: Construct, construct_id: str, *, name: str, alb: elbv2.ApplicationLoadBalancer) -> None:
        """name: the stack's name (the dashboard is `<name>-endpoint`); alb: the shared load balancer."""
        super().__init__(scope, construct_id)
        m = alb.metrics
        widgets = [
            _graph("Requests, every fleet (per minute)", [m.request_count(period=MINUTE, statistic="Sum")]),
            _graph(
                "The load balancer's own 4xx (404 model_not_found on the route listener) / 5xx (a fleet with no "
                "healthy instance)",
                [
                    m.http_code_elb(elbv2.HttpCodeElb.ELB_4XX_COUNT, period=MINUTE, statistic="Sum"),
                    m.http_code_elb(elbv2.HttpCodeElb.ELB_5XX_COUNT, period=MINUTE, statistic="Sum"),
                ],
            ),
            _graph(
                "Connections refused (the load balancer at its limit)", [m.rejected_connection_count(period=MINUTE)]
            ),
            _graph(
                "Target response time, every fleet (each fleet's own: its dashboard)",
                [m.target_response_time(statistic=p, period=MINUTE, label=p) for p in ("p50", "p95", "p99")],
            ),
        ]
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name}-endpoint")
        for i in range(0, len(widgets), 2):
            self.dashboard.add_widgets(*widgets[i : i + 2])


def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, left=metrics, width=12, height=6)
