"""Spot that cannot start does not stall a deploy: several pools, each type checked, an On-Demand base."""

from __future__ import annotations

from dataclasses import replace

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.loader import PROFILES_DIR, _check_spot_types, load_hardware
from stacks.app import build_app
from tests.committed import profile_by_stack
from tests.conftest import cdk_context

HARDWARE = load_hardware(PROFILES_DIR / "hardware.toml")


def test_spot_spreads_over_the_listed_types_above_an_on_demand_base_of_what_the_deploy_waits_for(tmp_path):
    app = build_app({**cdk_context(), "spot": "true"}, config_file=tmp_path / "absent.toml",
                    stack_names=["IntelMoeStack"])  # fmt: skip
    template = app.synth().get_stack_by_name("IntelMoeStack").template
    (group,) = [r["Properties"] for r in template["Resources"].values() if r["Type"].endswith("AutoScalingGroup")]
    policy = group["MixedInstancesPolicy"]
    types = [o["InstanceType"] for o in policy["LaunchTemplate"]["Overrides"]]
    assert types == ["c8i.4xlarge", "m8i.4xlarge"]
    capacity = profile_by_stack("IntelMoeStack").fleet.capacity
    distribution = policy["InstancesDistribution"]
    # The creation signal waits for min_capacity instances and a rolling update launches rolling_batch beside them.
    assert distribution["OnDemandBaseCapacity"] == capacity.min_capacity + capacity.rolling_batch
    assert distribution["OnDemandPercentageAboveBaseCapacity"] == 0
    assert not [r for r in template["Resources"].values() if r["Type"] == "AWS::AutoScaling::WarmPool"]


@pytest.mark.parametrize(
    ("alternative", "message"),
    [
        ("c8g.4xlarge", r"c8g.4xlarge \(arm64, 16 vCPUs, 16 cores\) is not shaped like c8i.4xlarge"),
        ("g5.xlarge", r"is not shaped like c8i.4xlarge"),
        ("c9z.4xlarge", r"unknown instance type 'c9z.4xlarge'"),
    ],
)
def test_a_spot_type_of_another_shape_is_refused_with_what_to_pick(alternative, message):
    p = profile_by_stack("IntelMoeStack")
    fleet = p.fleet.changed(spot_instance_types=(alternative,))
    with pytest.raises(ProfileError, match=message):
        _check_spot_types(fleet, p.hardware, HARDWARE, p.model, "intel-moe.toml: fleet.spot_instance_types")


def test_a_spot_type_with_less_memory_than_the_plan_was_checked_against_is_refused():
    p = profile_by_stack("IntelMoeStack")
    small = {**HARDWARE, "m8i.4xlarge": replace(HARDWARE["m8i.4xlarge"], memory_gib=16)}
    fleet = p.fleet.changed(spot_instance_types=("m8i.4xlarge",))
    with pytest.raises(ProfileError, match=r"m8i.4xlarge has 16 GiB of memory, less than c8i.4xlarge's 32"):
        _check_spot_types(fleet, p.hardware, small, p.model, "where")
