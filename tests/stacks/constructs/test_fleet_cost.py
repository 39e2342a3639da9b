"""The live cost per token (stacks/fleet_cost.py): the dashboard's expressions as synthesized, then the same
expressions evaluated over recorded counters by a small evaluator of CloudWatch metric math's operators (IF,
comparisons, + - * /), against the report's figure and a hand computation. No account: CloudWatch itself is not
asked; the evaluator reads the expression text the template holds."""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from dataclasses import replace

import pytest

from gguf_serve.container.metrics import names
from stacks.fleet_cost import DAY, HOUR, cost_basis, report_rate
from tests.committed import profile_by_stack
from tests.stacks.constructs.test_fleet_and_monitoring import _dashboard_body, _monitoring

_OPS: dict[type, Callable[[float, float], float]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
    ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Lt: operator.lt, ast.LtE: operator.le,
}  # fmt: skip


def evaluate(expression: str, values: dict[str, float]) -> float:
    """One data point of a metric-math expression: CloudWatch's IF(cond, a, b) evaluates one branch only."""

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Expression):
            return ev(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.Name):
            return values[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _OPS:
            return float(_OPS[type(node.ops[0])](ev(node.left), ev(node.comparators[0])))
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "IF" and len(node.args) == 3:
            return ev(node.args[1]) if ev(node.args[0]) else ev(node.args[2])
        raise ValueError(f"not metric math this evaluator knows: {ast.dump(node)}")

    return ev(ast.parse(expression, mode="eval"))


def _expressions(body: str) -> list[str]:
    return re.findall(r'\\"expression\\":\\"([^"\\]+)\\"', body)


def test_every_fleet_dashboard_shows_its_cost_per_million_beside_the_reports_figure(regional_stack):
    profile = profile_by_stack("GravitonMoeStack")
    basis = cost_basis(profile, profile.hardware)
    assert basis is not None and round(basis.full_load_cny_per_million, 2) == 7.41  # the report's ¥7.41
    body = _dashboard_body(_monitoring(regional_stack, "GravitonMoeStack", cost=basis))
    hourly, daily = basis.per_million("units_h", "tokens_h", HOUR), basis.per_million("units_d", "tokens_d", DAY)
    assert hourly in _expressions(body) and daily in _expressions(body)
    assert "priced 1-year RI all upfront / 12 / 30 days (the report's basis)" in body
    assert '\\"value\\":7.41' in body and "at 100% utilization: \\u00a57.41/M (the report's 39.34 tok/s)" in body
    assert names.OUTPUT_TOKENS in body and "GroupInServiceInstances" in body and names.SLOTS_BUSY_RATIO in body


def test_the_daily_expression_gives_the_reports_figure_at_full_load_and_multiplies_below_it():
    profile = profile_by_stack("GravitonMoeStack")
    basis = cost_basis(profile, profile.hardware)
    daily = basis.per_million("units_d", "tokens_d", DAY)
    full = 39.34 * 86400  # one instance, one stream, the whole day at the report's rate
    assert evaluate(daily, {"units_d": 1, "tokens_d": full}) == pytest.approx(7.41, abs=0.005)
    # Two instances at a quarter of that: 8 times the cost per token, as the report warns.
    assert evaluate(daily, {"units_d": 2, "tokens_d": full / 4}) == pytest.approx(8 * 7.41, abs=0.05)
    assert evaluate(daily, {"units_d": 1, "tokens_d": 0}) == 0  # nothing served: the spent widget shows the yuan
    by_hand = 9069 / 12 / 720 * 24 * 1e6 / full  # RI / months / hours a month × hours / tokens
    assert evaluate(daily, {"units_d": 1, "tokens_d": full}) == pytest.approx(by_hand)


@pytest.mark.parametrize(("stack", "figure"), [("IntelMoeStack", 25.32), ("GpuMtpStack", 22.98)])
def test_each_report_instance_gets_the_reports_own_figure(stack, figure):
    profile = profile_by_stack(stack)
    basis = cost_basis(profile, profile.hardware)
    assert round(basis.full_load_cny_per_million, 2) == figure


def test_the_alarm_fires_past_the_set_multiple_of_the_full_load_figure(regional_stack):
    profile = profile_by_stack("GravitonMoeStack")
    basis = cost_basis(profile, profile.hardware)
    t = _monitoring(regional_stack, "GravitonMoeStack", cost=basis,
                    alarms=replace(profile.fleet.alarms, cost_multiple=3.0))  # fmt: skip
    alarms = [a["Properties"] for a in t.find_resources("AWS::CloudWatch::Alarm").values()]
    (alarm,) = [a for a in alarms if "per million" in a.get("AlarmDescription", "")]
    assert alarm["Threshold"] == round(3 * basis.full_load_cny_per_million, 2)
    daily = next(m for m in alarm["Metrics"] if "Expression" in m)["Expression"]
    assert daily == basis.per_million("units_d", "tokens_d", DAY)
    assert evaluate(daily, {"units_d": 1, "tokens_d": 39.34 * 86400 / 4}) > alarm["Threshold"]  # a quarter busy
    assert evaluate(daily, {"units_d": 1, "tokens_d": 39.34 * 86400 / 2}) < alarm["Threshold"]  # half busy


def test_without_a_multiple_there_is_no_cost_alarm(regional_stack):
    profile = profile_by_stack("GravitonMoeStack")
    t = _monitoring(regional_stack, "GravitonMoeStack", cost=cost_basis(profile, profile.hardware))
    assert not [a for a in t.find_resources("AWS::CloudWatch::Alarm").values()
                if "per million" in a["Properties"].get("AlarmDescription", "")]  # fmt: skip


def test_an_on_demand_priced_type_and_spot_say_so():
    profile = profile_by_stack("GravitonMoeStack")
    hw = replace(profile.hardware, ri_1yr_all_upfront_cny=None, on_demand_cny_per_hour=2.5)
    basis = cost_basis(profile, hw, spot=True)
    assert basis.kind.startswith("On-Demand") and "no Spot price is published" in basis.kind
    assert basis.hourly_cny == pytest.approx(hw.on_demand_cny_per_hour)


def test_a_type_the_report_did_not_measure_has_no_invented_figure():
    rate, why = report_rate("m5.large", "Qwen3.6-35B-A3B", False)
    assert rate is None and "did not measure" in why


def test_the_evaluator_refuses_what_it_does_not_know():
    with pytest.raises(ValueError):
        evaluate("METRICS()", {})
    assert evaluate("IF(a > 0, 1 / a, 0)", {"a": 0}) == 0  # one branch only: no division by zero
