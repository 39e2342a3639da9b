"""What a fleet's tokens cost, live: yuan per million output tokens actually served, by CloudWatch metric math over
metrics that already exist (the serving units running) and the hop's count of output tokens (OutputTokens: each
relayed answer's predicted_n, published per scrape by gguf_serve/container/metrics). No Lambda: the expressions are
the dashboard's own, and an alarm can read them.

    spent(P)   = units × hourly price × P / 3600                    (¥ in the period P)
    ¥/M(P)     = IF(tokens > 0, 1,000,000 × spent(P) / tokens, 0)   (0 where nothing was served: see spent)

Beside it, the profile's figure at full load: the field report's one-stream rate priced the report's way (a 30-day
month, the 1-year RI all upfront over 12 months: ¥7.41 / 25.32 / 22.98), so the gap between the two lines is the
utilization the report warns about ("below it the cost per token multiplies"). One helper for every target with a
dashboard (EC2 groups, SageMaker variants): what differs is only which metric counts the units.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from aws_cdk import Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from constructs import Construct

from gguf_serve.catalog import Hardware, ServingProfile
from gguf_serve.local.bench import cost
from gguf_serve.local.bench.results import FIELD_REPORT

HOUR, DAY = Duration.hours(1), Duration.days(1)


@dataclass(frozen=True)
class CostBasis:
    hourly_cny: float  # one serving unit (an instance, an endpoint instance)
    kind: str  # how it is priced, named on the widget
    full_load_cny_per_million: float | None  # the profile's figure at 100% utilization, one stream
    full_load_basis: str  # where that figure's rate comes from

    def spent(self, units: str, period: Duration) -> str:
        """The expression for the yuan `units` running cost over `period`."""
        return f"{units} * {self.hourly_cny:.10g} * {period.to_seconds() / 3600:g}"

    def per_million(self, units: str, tokens: str, period: Duration) -> str:
        return f"IF({tokens} > 0, 1000000 * {self.spent(units, period)} / {tokens}, 0)"


def cost_basis(
    profile: ServingProfile, hw: Hardware, *, spot: bool = False, rate_type: str | None = None
) -> CostBasis | None:
    """The profile's price per unit-hour (the report's RI basis where the catalog has it, else on-demand), and its
    full-load figure: the report's rate on `rate_type` (default the profile's own type; a SageMaker twin names the
    EC2 type it replaces, the same CPU), at this price. None when the catalog has no price for its type."""
    if hw.ri_1yr_all_upfront_cny is not None:
        monthly = hw.ri_1yr_all_upfront_cny / cost.MONTHS_PER_YEAR
        kind = "1-year RI all upfront / 12 / 30 days (the report's basis)"
    elif hw.on_demand_cny_per_hour is not None:
        monthly = hw.on_demand_cny_per_hour * cost.ON_DEMAND_HOURS_PER_MONTH
        kind = "On-Demand (profiles/hardware.toml)"
    else:
        return None
    if hw.price_is_estimate:
        kind += ", an estimate"
    if spot:  # cn-northwest-1 publishes no Spot price (the Price List API has none there)
        kind += "; Spot capacity bills less, no Spot price is published for the region"
    tok_s, basis = report_rate(rate_type or hw.instance_type, profile.model.name, profile.mtp)
    if rate_type and rate_type != hw.instance_type:
        basis += f" on {rate_type}, priced as {hw.instance_type}"
    full = cost.cny_per_million(tok_s, monthly) if tok_s else None
    return CostBasis(monthly / cost.ON_DEMAND_HOURS_PER_MONTH, kind, full, basis)


def report_rate(instance_type: str, model: str, mtp: bool) -> tuple[float | None, str]:
    """The field report's one-stream tok/s for this type, model and MTP setting (its table 5.1), else the middle of
    its estimate's range; (None, why) when it has neither."""
    doc = json.loads(Path(FIELD_REPORT).read_text(encoding="utf-8"))
    for r in doc["results"]:
        if (r["instance_type"], r["model"], r["mtp"]) == (instance_type, model, mtp):
            return float(r["summary"]["effective_tok_s"]), f"the report's {r['summary']['effective_tok_s']} tok/s"
    for e in doc.get("estimates", []):
        if (e["instance_type"], e["model"], e["mtp"]) == (instance_type, model, mtp):
            mid = (e["tok_s_low"] + e["tok_s_high"]) / 2
            return mid, f"estimated {e['tok_s_low']}-{e['tok_s_high']} tok/s"
    return None, "the report did not measure this type and model"


def cost_widgets(
    scope: Construct,
    *,
    name: str,
    basis: CostBasis,
    units: cloudwatch.IMetric,
    tokens: cloudwatch.IMetric,
    busy: cloudwatch.IMetric,
    alarm_multiple: float = 0.0,
    seconds_per_sample: float | None = None,
) -> tuple[list[cloudwatch.IWidget], cloudwatch.Alarm | None]:
    """The cost widgets (¥/M per hour and per day with the full-load figure, ¥ spent, utilization) and, with
    `alarm_multiple`, an alarm when a day's ¥/M passes that multiple of the full-load figure.

    units: the serving units running, their Average over the period (an Auto Scaling group's in-service count); or,
    with `seconds_per_sample`, a metric each unit puts once per that many seconds, whose SampleCount over the period
    counts the units (a SageMaker variant: each instance's container publishes every 60 s). tokens: OutputTokens
    (Sum); busy: busy slots %."""
    statistic = "Average" if seconds_per_sample is None else "SampleCount"

    def running(unit_id: str, period: Duration) -> str:
        if seconds_per_sample is None:
            return unit_id
        return f"({unit_id} * {seconds_per_sample:g} / {period.to_seconds():g})"

    lines = []
    for period, label in ((HOUR, "hourly"), (DAY, "daily")):
        # one id per period: a graph's metrics of one id must be the same metric (the period is part of it)
        u, t = f"units_{label[0]}", f"tokens_{label[0]}"
        using = {u: units.with_(statistic=statistic, period=period),  # type: ignore[attr-defined]
                 t: tokens.with_(statistic="Sum", period=period)}  # type: ignore[attr-defined]  # fmt: skip
        lines.append(cloudwatch.MathExpression(
            expression=basis.per_million(running(u, period), t, period), using_metrics=using, period=period,
            label=f"¥ per million output tokens, {label}",
        ))  # fmt: skip
    annotations = []
    if basis.full_load_cny_per_million is not None:
        annotations.append(cloudwatch.HorizontalAnnotation(
            value=round(basis.full_load_cny_per_million, 2),
            label=f"at 100% utilization: ¥{basis.full_load_cny_per_million:.2f}/M ({basis.full_load_basis})",
        ))  # fmt: skip
    spent = [
        cloudwatch.MathExpression(expression=basis.spent(running("units", HOUR), HOUR),
                                  using_metrics={"units": units.with_(statistic=statistic, period=HOUR)},  # type: ignore[attr-defined]
                                  period=HOUR, label=f"¥ per hour ({basis.hourly_cny:.2f} per unit)"),
        tokens.with_(statistic="Sum", period=HOUR, label="output tokens per hour"),  # type: ignore[attr-defined]
    ]  # fmt: skip
    widgets: list[cloudwatch.IWidget] = [
        cloudwatch.GraphWidget(title=f"¥ per million output tokens served, priced {basis.kind}", left=lines,
                               left_annotations=annotations, width=12, height=6),
        cloudwatch.GraphWidget(title="¥ spent and output tokens served, per hour (0 ¥/M above: nothing served)",
                               left=spent[:1], right=spent[1:], width=12, height=6),
        cloudwatch.GraphWidget(title="Utilization behind it: busy slot-seconds / slot-seconds, %",
                               left=[busy.with_(statistic="Average", period=HOUR, label="busy slots %")],  # type: ignore[attr-defined]
                               left_annotations=[cloudwatch.HorizontalAnnotation(value=100, label="the report's 100%")],
                               width=12, height=6),
    ]  # fmt: skip
    alarm = None
    if alarm_multiple > 0 and basis.full_load_cny_per_million is not None:
        limit = alarm_multiple * basis.full_load_cny_per_million
        alarm = lines[1].create_alarm(
            scope, "CostPerTokenDaily", threshold=round(limit, 2), evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=(f"{name}: a day's output tokens cost more than ¥{limit:.2f} per million, "
                               f"{alarm_multiple:g} x the ¥{basis.full_load_cny_per_million:.2f} at full load "
                               "(idle capacity: lower the minimum, sleep off hours, or take fewer instances)"),
        )  # fmt: skip
    return widgets, alarm
