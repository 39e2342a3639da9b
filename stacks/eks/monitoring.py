"""The EKS stack's dashboard: what each profile's tokens cost, live, with the EC2 and SageMaker dashboards' metric
math (stacks/fleet_cost.py) over what each profile's scaler publishes (gguf_serve/container/kube/usage.py): its nodes,
the output tokens its pods relayed, their busy slots. No agent and no Container Insights: the scaler scrapes the pods
for its scaling anyway."""

from __future__ import annotations

from dataclasses import dataclass

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from gguf_serve.container.metrics import names
from stacks.fleet_cost import CostBasis, cost_widgets


@dataclass(frozen=True)
class ProfileCost:
    profile: str
    usage_profile: str  # the EksProfile dimension its scaler publishes under
    basis: CostBasis | None  # None: the catalog has no price for its type (no cost widgets, said on the dashboard)
    alarm_multiple: float = 0.0  # fleet.alarms.cost_multiple


def usage_metric(usage_profile: str, metric_name: str, statistic: str) -> cloudwatch.Metric:
    return cloudwatch.Metric(
        namespace=names.NAMESPACE, metric_name=metric_name, statistic=statistic, period=Duration.minutes(1),
        dimensions_map={names.DIM_EKS_PROFILE: usage_profile},
    )  # fmt: skip


class EksCostDashboard(Construct):
    """`<name>-llama`: a row per profile, ¥ per million output tokens served (hourly, daily) beside the profile's
    figure at full load, ¥ spent with the tokens served, and the utilization behind it."""

    def __init__(self, scope: Construct, construct_id: str, *, name: str, profiles: list[ProfileCost]) -> None:
        super().__init__(scope, construct_id)
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=f"{name}-llama")
        self.cost_per_token: dict[str, cloudwatch.Alarm] = {}
        for p in profiles:
            if p.basis is None:
                self.dashboard.add_widgets(cloudwatch.TextWidget(
                    markdown=f"### {p.profile}\nNo price for its type in profiles/hardware.toml: no cost here.",
                    width=24, height=2,
                ))  # fmt: skip
                continue
            widgets, alarm = cost_widgets(
                Construct(self, p.profile), name=f"{name} {p.profile}", basis=p.basis,
                units=usage_metric(p.usage_profile, names.SERVING_NODES, "Average"),
                tokens=usage_metric(p.usage_profile, names.OUTPUT_TOKENS, "Sum"),
                busy=usage_metric(p.usage_profile, names.SLOTS_BUSY_RATIO, "Average"), alarm_multiple=p.alarm_multiple,
            )  # fmt: skip
            self.dashboard.add_widgets(cloudwatch.TextWidget(
                markdown=f"### {p.profile}: its nodes priced {p.basis.kind} (not the cluster's own hourly fee)",
                width=24, height=1,
            ))  # fmt: skip
            self.dashboard.add_widgets(*widgets)
            if alarm is not None:
                self.cost_per_token[p.profile] = alarm
