"""What a first `cdk deploy` in an AWS China account trips over: disk, boot budget, warm-pool releases, quotas."""

from __future__ import annotations

import json
import re
from dataclasses import replace

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.profiles import MAX_HOOK_HEARTBEAT_S
from stacks.fleet import release_parameter_name
from tests.committed import PROFILES, profile_by_stack
from tests.conftest import ROOT
from tests.stacks.conftest import STACK_NAMES
from tests.stacks.test_templates import hook, only, resources, user_data
from userdata.render import InstanceSpec, release_id


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_root_volume_holds_the_ami_snapshot_the_model_and_the_image(templates, stack):
    t, p = templates[stack], profile_by_stack(stack)
    (mapping,) = only(t, "AWS::EC2::LaunchTemplate")["LaunchTemplateData"]["BlockDeviceMappings"]
    size = mapping["Ebs"]["VolumeSize"]
    assert size == p.root_volume_gib
    # EC2 refuses a root volume smaller than the AMI's snapshot; what is left must hold the model and the image.
    assert size - p.hardware.ami_root_snapshot_gib >= p.model.size_bytes / 1024**3 + p.fleet.boot.image_pull_gib * 3


def test_gpu_volume_fits_the_deep_learning_ami():
    p = PROFILES["gpu-mtp"]
    assert p.hardware.ami_root_snapshot_gib >= 75  # the DLAMI's root snapshot (profiles/hardware.toml, with source)
    assert p.root_volume_gib >= 100  # AWS's recommended size for that AMI


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_every_wait_covers_the_whole_first_boot(templates, stack):
    t, p = templates[stack], profile_by_stack(stack)
    plan = p.boot_plan_s()
    assert set(plan) >= {"packages", "image_pull", "model_download", "cache_write_back", "model_load"}
    assert p.boot_budget_s >= sum(plan.values())
    (asg,) = resources(t, "AWS::AutoScaling::AutoScalingGroup").values()
    ready = hook(t, "LAUNCHING")
    assert asg["Properties"]["HealthCheckGracePeriod"] == p.boot_budget_s
    assert asg["CreationPolicy"]["ResourceSignal"]["Timeout"] == f"PT{p.boot_budget_s // 60}M"
    assert ready["HeartbeatTimeout"] == p.boot_budget_s <= MAX_HOOK_HEARTBEAT_S


def test_a_boot_longer_than_a_hook_can_wait_is_refused():
    slow = PROFILES["graviton-moe"].fleet.changed(planning_download_mib_s=2.0)
    with pytest.raises(ProfileError, match=r"more than a launch lifecycle hook can wait \(7200 s\)"):
        replace(PROFILES["graviton-moe"], fleet=slow)


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_warm_pool_instances_check_their_release(templates, stack):
    t = templates[stack]
    res = t.to_json()["Resources"]
    (param_id,) = [k for k, v in res.items() if v["Type"] == "AWS::SSM::Parameter"]
    param = res[param_id]["Properties"]
    ud = user_data(t)
    assert param["Name"] == release_parameter_name(stack)
    assert f"\nRELEASE={param['Value']}\n" in ud  # the release rendered into this launch template
    assert '!= "\\$RELEASE" ]]' in ud  # and compared with the parameter by the readiness script
    assert "--lifecycle-action-result ABANDON" in ud
    assert param_id in res["ServingGroup"]["DependsOn"]  # published before the rolling update starts
    # The instance role may read that parameter and nothing else in SSM Parameter Store.
    policies = [v["Properties"]["PolicyDocument"]["Statement"] for v in res.values() if v["Type"] == "AWS::IAM::Policy"]
    ssm = [s for st in policies for s in st if any(str(a).startswith("ssm:Get") for a in _actions(s))]
    assert ssm and all(s["Resource"] != "*" and param_id in json.dumps(s["Resource"]) for s in ssm)
    assert re.fullmatch(r"[0-9a-f]{16}", param["Value"])


def test_release_changes_with_what_the_instance_runs():
    p = PROFILES["intel-moe"]
    base = release_id(InstanceSpec.of(p), "x86-64-cpu-0123456789abcdef")
    assert release_id(InstanceSpec.of(p), "x86-64-cpu-0123456789abcdef") == base
    assert release_id(InstanceSpec.of(p), "x86-64-cpu-fedcba9876543210") != base
    assert release_id(InstanceSpec.of(p.with_server(ctx_per_slot=16384)), "x86-64-cpu-0123456789abcdef") != base


def _actions(statement: dict) -> list[str]:
    a = statement["Action"]
    return a if isinstance(a, list) else [a]


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_gpu_metrics_agent_can_resolve_its_group_dimension(templates, stack):
    t = templates[stack]
    res = t.to_json()["Resources"]
    policies = [v["Properties"]["PolicyDocument"] for v in res.values() if v["Type"] == "AWS::IAM::Policy"]
    statements = [s for doc in policies for s in doc["Statement"]]
    describe_tags = any("ec2:DescribeTags" in _actions(s) for s in statements)
    assert ("${aws:AutoScalingGroupName}" in user_data(t)) == describe_tags


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_vcpu_plan_counts_the_warm_pool_and_the_rolling_update(templates, stack):
    t, p = templates[stack], profile_by_stack(stack)
    (asg,) = resources(t, "AWS::AutoScaling::AutoScalingGroup").values()
    pools = [r["Properties"]["MinSize"] for r in resources(t, "AWS::AutoScaling::WarmPool").values()]
    running_at_create = int(asg["Properties"]["MinSize"]) + sum(pools)
    batch = asg["UpdatePolicy"]["AutoScalingRollingUpdate"]["MaxBatchSize"]
    plan = p.vcpu_plan()
    assert plan["create"] == running_at_create * p.hardware.vcpus
    assert plan["update"] == (running_at_create + batch) * p.hardware.vcpus
    if p.hardware.has_gpu:
        assert (plan["create"], plan["update"]) == (8, 12)  # g5.xlarge: 4 vCPUs each, not the 4 once quoted


def test_the_quota_table_matches_the_catalog():
    _, section = (ROOT / "docs" / "deploying.md").read_text().split("## vCPU quotas", 1)
    section = section.split("\n## ", 1)[0]
    for p in PROFILES.values():
        plan = p.vcpu_plan()
        row = re.search(rf"^\| `{p.stack_name}` \|[^\n]*", section, flags=re.M)
        assert row, f"docs/deploying.md has no quota row for {p.stack_name}"
        cells = [c.strip() for c in row.group(0).strip("|").split("|")]
        assert cells[2:5] == [str(plan["create"]), str(plan["update"]), str(plan["scale_out"])], cells


def test_a_price_or_description_edit_changes_no_instance():
    """The user data (so the launch template) and the release id ignore prices and descriptions."""
    from dataclasses import replace as swap

    from tests.userdata.test_boot_script import BOOT
    from userdata import InstanceSpec, render_user_data

    p = PROFILES["gpu-mtp"]
    edited = swap(p, description="cheaper now", hardware=swap(p.hardware, ri_1yr_all_upfront_cny=1.0))
    assert render_user_data(InstanceSpec.of(edited), BOOT) == render_user_data(InstanceSpec.of(p), BOOT)
    assert release_id(InstanceSpec.of(edited), "cuda-0123456789abcdef") == release_id(
        InstanceSpec.of(p), "cuda-0123456789abcdef"
    )
    faster = p.with_server(ctx_per_slot=16384)
    assert render_user_data(InstanceSpec.of(faster), BOOT) != render_user_data(InstanceSpec.of(p), BOOT)


def _needs(template: dict) -> dict[str, set[str]]:
    """Each resource's logical ids it needs created first: DependsOn, Ref and Fn::GetAtt, followed through."""
    resources = template["Resources"]

    def direct(node: object) -> set[str]:
        if isinstance(node, dict):
            found = {node["Ref"]} if isinstance(node.get("Ref"), str) else set()
            if "Fn::GetAtt" in node:
                target = node["Fn::GetAtt"]
                found.add(target[0] if isinstance(target, list) else target.split(".")[0])
            return found.union(*(direct(v) for v in node.values()))
        if isinstance(node, list):
            return set().union(*(direct(v) for v in node))
        return set()

    edges = {}
    for name, r in resources.items():
        after = r.get("DependsOn", [])
        edges[name] = (direct(r.get("Properties", {})) | set([after] if isinstance(after, str) else after)) & set(
            resources
        )
    closure: dict[str, set[str]] = {}

    def walk(name: str) -> set[str]:
        if name not in closure:
            closure[name] = set()
            closure[name] = edges[name].union(*(walk(n) | {n} for n in edges[name]))
        return closure[name]

    return {name: walk(name) for name in resources}


@pytest.mark.parametrize("options", [{}, {"wakeOnRequest": "true", "minCapacity": "0"}], ids=["default", "wake"])
def test_what_only_watches_or_wakes_the_group_does_not_wait_for_its_first_signal(options, tmp_path):
    """Alarms, the dashboard and the wake door are created in the first minutes, beside the load balancer: a
    refusal of any of them comes before the image build and the boot, not 40 minutes after. What acts on the group
    (scaling policies and their alarms, scheduled actions, the warm pool) follows it."""
    from stacks.app import build_app
    from tests.conftest import cdk_context

    app = build_app({**cdk_context(), **options}, config_file=tmp_path / "absent.toml", stack_names=["IntelMoeStack"])
    template = app.synth().get_stack_by_name("IntelMoeStack").template
    needs, kinds = _needs(template), {k: r["Type"] for k, r in template["Resources"].items()}
    early = [
        k for k, t in kinds.items() if t == "AWS::CloudWatch::Dashboard" or k.startswith(("Monitoring", "WakeDoor"))
    ]
    assert any(kinds[k] == "AWS::CloudWatch::Alarm" for k in early) and (
        not options or any("WakeDoor" in k for k in early)
    )
    for name in early:
        assert "ServingGroup" not in needs[name] and not any("ImageBuild" in n for n in needs[name]), name
    follow = [k for k, t in kinds.items() if t in ("AWS::AutoScaling::ScalingPolicy", "AWS::AutoScaling::WarmPool")]
    assert follow and all("ServingGroup" in needs[k] for k in follow)
    (group,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::AutoScaling::AutoScalingGroup"]
    assert group["Properties"]["AutoScalingGroupName"] == "IntelMoeStack-ServingGroup-serving"
