"""Deploy options as users set them: deploy.toml or `-c`, through the same build_app and cdk-nag plugin as the CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Template

from gguf_serve.local.cache import cache_root
from stacks.app import build_app
from stacks.options import DEPLOY_CONFIG, OPTION_NAMES, DeployOptionError, DeployOptions, load_options
from stacks.plan import plan_service
from stacks.shared_endpoint import STACK_NAME as SHARED_STACK
from tests.committed import PROFILES, profile_by_stack
from tests.conftest import ROOT, cdk_context
from tests.stacks.conftest import DOCUMENTED, STACK_NAMES, SYNTHESIZED
from tests.stacks.eks.conftest import CONTEXT as EKS_CONTEXT
from tests.stacks.shared.conftest import CONTEXT as SHARED_CONTEXT
from tests.stacks.shared.conftest import MEMBERS as SHARED_MEMBERS
from tests.whole_app import BUILD_ARGS, CERT, IAM_CERT, OPTION_SETS

ZONES = ("cn-northwest-1a", "cn-northwest-1b")


def _cli_env(tmp_path: Path) -> dict[str, str]:
    """The CLI as a user without credentials runs it: no AWS variables, an empty home."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    # The staged image sources stay where `make image-sources` put them (under the real home's cache).
    cache = str(cache_root())
    return {
        **env,
        "HOME": str(tmp_path),
        "LLAMA_SERVER_CACHE": cache,
        "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
    }


@pytest.mark.scan
@pytest.mark.slow
def test_every_whole_app_option_set_synthesizes_cfn_lint_clean(synthesized):
    files = [str(f) for stacks in synthesized.values() for f in stacks.values()]
    lint = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--config-file", str(ROOT / ".cfnlintrc.yaml"), "--", *files],
        capture_output=True,
        text=True,
    )
    assert lint.returncode == 0, lint.stdout + lint.stderr


def test_the_whole_app_sets_hold_every_option_and_the_readme_documents_each_option():
    """At most three whole-app syntheses in the fast tier, and in them every option: cdk-nag, cfn-lint and checkov
    see each one in a whole app (the rest is tested on constructs alone)."""
    assert len(OPTION_SETS) <= 3 and set(SYNTHESIZED) < set(OPTION_SETS)
    eks = set(EKS_CONTEXT) - {k for values in OPTION_SETS.values() for k in values}  # EksServingStack's own synth
    shared = set(SHARED_CONTEXT)  # SharedEndpointStack's own synth, with three EC2 stacks (tests/stacks/shared/)
    alone = {"eksAutoModeFields"}  # a second cluster synth would double the EKS time: test_eks_stack.py builds it
    assert {k for values in OPTION_SETS.values() for k in values} | eks | shared | alone == set(OPTION_NAMES)
    every = {k for ctx in DOCUMENTED.values() for k in ctx}
    assert every <= set(OPTION_NAMES) and set(PARSED) == set(DOCUMENTED) | set(SYNTHESIZED)
    # The option table: one, in the README, naming every option the app knows and nothing else.
    header = "| option | default | what it does |"
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    tables = [part.split("\n\n", 1)[0] for page in pages for part in page.read_text().split(header)[1:]]
    assert len(tables) == 1 and header in (ROOT / "README.md").read_text()
    named = re.findall(r"^\| `(\w+)` \|", tables[0], flags=re.M)
    assert sorted(named) == sorted(OPTION_NAMES)


def test_the_cdk_nag_plugin_is_in_the_path(tmp_path):
    """Negative control: the same build_app fails synth on a finding, so the suite above would see one."""
    app = build_app(cdk_context(), config_file=tmp_path / "absent.toml", stack_names=["IntelMoeStack"])
    ec2.CfnVolume(app.node.find_child("IntelMoeStack"), "Plain", availability_zone="cn-northwest-1a", size=8)
    with pytest.raises(Exception, match="AwsSolutions-EC26"):
        app.synth()


def _template(files: dict[str, Path], stack: str) -> dict:
    return json.loads(files[stack].read_text())


def _resources(doc: dict, kind: str) -> dict:
    return {k: v for k, v in doc["Resources"].items() if v["Type"] == kind}


DEFAULTS = DeployOptions()
PARSED = {  # what each documented set is, parsed; the fields it leaves alone keep DeployOptions' defaults
    "spot": {"spot": True},
    "off-hours": {"off_hours": (20, 8)},
    "allowed-cidrs": {"allowed_cidrs": ("10.8.0.0/16", "192.168.10.0/24")},
    "acm-certificate": {"certificate_arn": CERT},
    "iam-certificate": {"certificate_arn": IAM_CERT},
    "build-args": {"image_build_args": {"PIP_INDEX_URL": "https://mirrors.aliyun.com/pypi/simple"}},
    "no-warm-pool": {"warm_pool": 0},
    "native-arm64-builder": {"arm64_builder": "native"},
    "beijing": {"region": "cn-north-1"},
    "cost-saver": {"spot": True, "off_hours": (20, 8)},
    "scale-from-zero": {"min_capacity": 0, "wake_on_request": True},
    "off-hours-wake": {"off_hours": (20, 8), "wake_on_request": True},
    "locked-down": {"allowed_cidrs": ("10.8.0.0/16",), "certificate_arn": CERT, "off_hours": (20, 8)},
    # the whole-app sets (tests/whole_app.py)
    "ningxia-from-zero": {
        "min_capacity": 0,
        "wake_on_request": True,
        "warm_pool": 0,
        "allowed_cidrs": ("10.8.0.0/16", "192.168.10.0/24"),
        "image_build_args": dict(pair.split("=", 1) for pair in BUILD_ARGS.split(",")),
        "arm64_builder": "native",
        "debian_mirrors": ("http://mirrors.ustc.edu.cn/debian", "https://mirrors.aliyun.com/debian"),
        "allow_typed_lock": True,
    },
    "beijing-cost-saver": {
        "region": "cn-north-1",
        "account": "111122223333",
        "spot": True,
        "off_hours": (20, 8),
        "wake_on_request": True,
        "certificate_arn": IAM_CERT,
        "sagemaker_unlisted_types": True,
        "sagemaker_scaling_metric": "slots",
        "sagemaker_inference_ami": False,
    },
}


@pytest.mark.parametrize("name", [*DOCUMENTED, *SYNTHESIZED])
def test_each_documented_and_whole_app_set_parses_to_its_options(name, tmp_path):
    values = DOCUMENTED[name] if name in DOCUMENTED else OPTION_SETS[name]
    assert load_options(values, tmp_path / "absent.toml") == replace(DEFAULTS, **PARSED[name])


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_the_plan_applies_the_options_spot_on_cpu_only_and_without_a_warm_pool(stack):
    p = profile_by_stack(stack)
    cpu = not p.hardware.has_gpu
    options = DeployOptions(spot=True, warm_pool=3, off_hours=(20, 8), allowed_cidrs=("10.8.0.0/16",))
    plan = plan_service(p, options, ZONES)
    # g5 Spot capacity in China is scarce: GPU stays on demand; PutWarmPool refuses a Spot group
    assert plan.spot is cpu and plan.capacity == replace(p.fleet.capacity, warm_pool_size=0 if cpu else 3)
    assert plan.wake_s == p.wake_up_s(warm_pool=not cpu)  # a Spot group wakes from the S3 cache
    assert plan.profile is p and plan.options is options and plan.sleeps  # the catalog's profile, untouched
    assert plan_service(p, DeployOptions(warm_pool=0), ZONES).capacity.warm_pool_size == 0
    woken = plan_service(p, DeployOptions(min_capacity=0, wake_on_request=True), ZONES)
    assert woken.capacity == replace(p.fleet.capacity, min_capacity=0) and woken.sleeps and not woken.spot


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (DeployOptions(min_capacity=5), r"^minCapacity: 5 is more than IntelMoeStack's max_capacity \(4\); lower it"),
        (DeployOptions(warm_pool=9), r"^warmPool: 9 is more than IntelMoeStack's max_capacity \(4\)"),
    ],
)
def test_an_option_past_the_profiles_maximum_is_refused_with_what_to_change(options, says):
    with pytest.raises(DeployOptionError, match=says):
        plan_service(profile_by_stack("IntelMoeStack"), options, ZONES)


def _build_env(doc: dict) -> dict:
    (project,) = _resources(doc, "AWS::CodeBuild::Project").values()
    return project["Properties"]["Environment"]


def test_the_options_build_app_passes_on_reach_every_stack(synthesized):
    """What build_app hands each ServingStack (certificate, callers, Spot, off hours, build args, arm64 builder,
    mirror), read from the whole-app sets. What each does to its construct: constructs/."""
    for stack in STACK_NAMES:
        p = profile_by_stack(stack)
        beijing = _template(synthesized["beijing-cost-saver"], stack)
        (listener,) = _resources(beijing, "AWS::ElasticLoadBalancingV2::Listener").values()
        assert listener["Properties"]["Certificates"] == [{"CertificateArn": IAM_CERT}]
        assert "https://" in json.dumps(beijing["Outputs"]["EndpointUrl"])
        actions = _resources(beijing, "AWS::AutoScaling::ScheduledAction").values()
        schedule = {a["Properties"]["Recurrence"]: a["Properties"] for a in actions}
        assert schedule["0 8 * * MON-FRI"]["MinSize"] == p.fleet.capacity.min_capacity  # back to the profile's minimum
        (group,) = _resources(beijing, "AWS::AutoScaling::AutoScalingGroup").values()
        assert ("MixedInstancesPolicy" in group["Properties"]) is not p.hardware.has_gpu  # Spot: the CPU stacks only
        ningxia = _template(synthesized["ningxia-from-zero"], stack)
        alb_sg = next(
            v for k, v in _resources(ningxia, "AWS::EC2::SecurityGroup").items() if k.startswith("LoadBalancer")
        )
        assert [r["CidrIp"] for r in alb_sg["Properties"]["SecurityGroupIngress"]] == ["10.8.0.0/16", "192.168.10.0/24"]
        env = {e["Name"]: e["Value"] for e in _build_env(ningxia)["EnvironmentVariables"]}
        assert env["BUILD_ARGS"] == " ".join(sorted(BUILD_ARGS.split(",")))
        assert env["DEBIAN_MIRRORS"] == OPTION_SETS["ningxia-from-zero"]["debianMirrors"].replace(",", " ")
        native = _build_env(ningxia)["Image"]
        assert ("aarch64" in native) == (p.hardware.architecture.value == "arm64"), native


@pytest.mark.parametrize(
    ("option", "value", "says"),
    [
        ("allowedCidrs", "10.0.0.0/33", "not an IPv4 network"),
        ("allowedCidrs", "10.0.0.1/8", "did you mean 10.0.0.0/8"),
        ("allowedCidrs", "0.0.0.0/0", "more than a /8"),
        ("allowedCidrs", "0.0.0.0/1,128.0.0.0/1", "more than a /8"),
        ("allowedCidrs", "10.0.0.0/9,10.128.0.0/9,11.0.0.0/9", "more than a /8"),
        ("allowedCidrs", "fd00::/8", "IPv6"),
        ("offHours", "8-8", "same hour"),
        ("offHours", "20-24", "hours are 0-23"),
        ("offHours", "evenings", "offHours=20-8"),
        ("certificateArn", "not-an-arn", "is not a certificate ARN"),
        ("certificateArn", CERT.replace("cn-northwest-1", "cn-north-1"), "the load balancer is in cn-northwest-1"),
        ("certificateArn", CERT.replace("aws-cn", "aws"), "partition 'aws'"),
        ("spot", "yes", "is not true or false"),
        ("warmPool", "-1", "out of range"),
        ("warmPool", "many", "not a whole number"),
        ("imageBuildArgs", "oops", "NAME=value"),
        ("imageBuildArgs", "PIP_INDEX_URL=https://x --network=host", "no spaces"),
        ("imageBuildArgs", "1BAD=x", "not a build-arg name"),
        ("account", "12345", "12-digit"),
        ("arm64Builder", "fast", "use one of cross, native"),
    ],
)
def test_bad_option_fails_at_synth_with_what_to_change(option, value, says, tmp_path):
    with pytest.raises(DeployOptionError, match=re.escape(says)) as err:
        build_app({**cdk_context(), option: value}, config_file=tmp_path / "absent.toml")
    assert str(err.value).startswith(f"{option} (from -c)")


def test_committed_deploy_toml_is_valid_and_keeps_the_catalog_defaults():
    options = load_options({}, DEPLOY_CONFIG)
    assert options.region == "cn-northwest-1" and options.account is None
    assert (options.spot, options.off_hours, options.allowed_cidrs, options.certificate_arn) == (False, None, (), None)
    assert options.warm_pool is None and options.min_capacity is None  # the profile's own warm pool and minimum
    for profile in PROFILES.values():  # so the templates are the catalog's (the snapshots)
        plan = plan_service(profile, options, ZONES)
        assert plan.capacity == profile.fleet.capacity and not plan.spot and not plan.sleeps


def test_options_in_deploy_toml_persist_and_c_overrides_one_run(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text(f'spot = true\nallowedCidrs = ["10.8.0.0/16"]\ncertificateArn = "{CERT}"\n')
    kept = load_options({}, config)
    assert kept.spot and kept.allowed_cidrs == ("10.8.0.0/16",) and kept.certificate_arn == CERT
    once = load_options({"spot": "false", "allowedCidrs": "10.9.0.0/16"}, config)
    assert not once.spot and once.allowed_cidrs == ("10.9.0.0/16",) and once.certificate_arn == CERT
    # Through the app: the file alone gives a Spot group and the HTTPS listener, with no -c at all.
    app = build_app(cdk_context(), config_file=config, stack_names=["IntelMoeStack"])
    doc = Template.from_stack(app.node.find_child("IntelMoeStack")).to_json()
    (group,) = _resources(doc, "AWS::AutoScaling::AutoScalingGroup").values()
    (listener,) = _resources(doc, "AWS::ElasticLoadBalancingV2::Listener").values()
    assert "MixedInstancesPolicy" in group["Properties"] and listener["Properties"]["Port"] == 443


def test_deploy_toml_errors_name_the_file(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text('offHours = "8-8"\n')
    with pytest.raises(DeployOptionError, match=r"^offHours \(from deploy.toml\)"):
        load_options({}, config)
    config.write_text("spots = true\n")
    with pytest.raises(DeployOptionError, match="unknown option"):
        load_options({}, config)


def test_defaults_match_an_empty_file(tmp_path):
    assert load_options({}, tmp_path / "absent.toml") == DeployOptions(warm_pool=None)


def _without_cli_metadata(doc: dict) -> dict:
    """What the CLI adds to a template and an in-process App does not: construct paths (aws:cdk:path), asset
    metadata (aws:asset:*) and the CDKMetadata resource with its condition (version reporting)."""
    doc["Resources"] = {k: v for k, v in doc["Resources"].items() if v["Type"] != "AWS::CDK::Metadata"}
    for resource in doc["Resources"].values():
        for key in [k for k in resource.get("Metadata", {}) if k == "aws:cdk:path" or k.startswith("aws:asset:")]:
            del resource["Metadata"][key]
        if resource.get("Metadata") == {}:
            del resource["Metadata"]
    doc.get("Conditions", {}).pop("CDKMetadataAvailable", None)
    if doc.get("Conditions") == {}:
        del doc["Conditions"]
    return doc


@pytest.mark.cli
@pytest.mark.slow  # each call starts node, then the app in a new Python with its own jsii
class TestTheRealCli:
    """`npx cdk ...` exactly as the README tells users to run it (pinned CLI, no credentials)."""

    def _cdk(self, tmp_path: Path, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
        return subprocess.run(
            ["npx", "--prefix", str(ROOT), "cdk", *args],
            cwd=cwd,
            env=_cli_env(tmp_path),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def test_synth_with_spot_passes_cdk_nag_and_writes_what_the_tests_read(self, tmp_path, synthesized):
        """The Beijing set (Spot, off hours, a request wakes the group, HTTPS) through the CLI: every stack, GpuMtpStack
        too (the tests' lock, in which synth's lookup pinned the 27B from the local hub: tests/catalog/stand_in.py;
        no lookup of the typed 35B: test_first_synth_lock.py), gives the templates build_app gave the tests."""
        from tests.catalog.stand_in import stand_in_lock

        lock = stand_in_lock(tmp_path)
        options = [a for k, v in OPTION_SETS["beijing-cost-saver"].items() for a in ("-c", f"{k}={v}")]
        args = (*options, "-c", f"modelLock={lock}", "-c", "modelLookup=false", "-c", "allowTypedLock=true")
        out = self._cdk(tmp_path, "synth", *args, "--quiet", "-o", str(tmp_path / "cdk.out"))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        for stack, template_file in synthesized["beijing-cost-saver"].items():
            cli = _without_cli_metadata(json.loads((tmp_path / "cdk.out" / template_file.name).read_text()))
            assert cli == json.loads(template_file.read_text()), stack

    def test_a_shared_endpoint_deploys_before_the_stacks_behind_it_and_synthesizes_as_the_tests_read(
        self, tmp_path, shared_assembly
    ):
        """`cdk list --show-dependencies` is what `cdk deploy GravitonMoeStack` follows: SharedEndpointStack first;
        the templates are the ones build_app gave the tests."""
        from tests.catalog.stand_in import stand_in_lock

        lock = stand_in_lock(tmp_path)
        options = [a for k, v in SHARED_CONTEXT.items() for a in ("-c", f"{k}={v}")]
        args = (*options, "-c", f"modelLock={lock}", "-c", "modelLookup=false", "-c", "allowTypedLock=true")
        out = self._cdk(tmp_path, "list", "--show-dependencies", "--json", *args, "-o", str(tmp_path / "cdk.out"))
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        listed = {entry["id"]: entry["dependencies"] for entry in json.loads(out.stdout)}
        for member in SHARED_MEMBERS:
            assert SHARED_STACK in [d["id"] for d in listed[member]], listed[member]
        assert [d["id"] for d in listed[SHARED_STACK]] == []
        assert "GravitonMoeStack" in [d["id"] for d in listed["IntelMoeStack"]]  # it balances Graviton's 35B
        for stack in (SHARED_STACK, *SHARED_MEMBERS):
            cli = _without_cli_metadata(json.loads((tmp_path / "cdk.out" / f"{stack}.template.json").read_text()))
            assert cli == json.loads((shared_assembly / f"{stack}.template.json").read_text()), stack

    def test_a_bad_option_fails_synth_in_one_line(self, tmp_path):
        out = self._cdk(tmp_path, "synth", "-c", "allowedCidrs=10.0.0.0/33", "--quiet", "-o", str(tmp_path / "o"))
        assert out.returncode != 0
        assert "error: allowedCidrs (from -c): '10.0.0.0/33' is not an IPv4 network" in out.stderr
        assert "Traceback" not in out.stderr

    def test_readme_bootstrap_line_is_accepted(self, tmp_path):
        readme = (ROOT / "README.md").read_text()
        (line,) = re.findall(r"^npx cdk bootstrap (\S+)", readme, flags=re.M)
        target = line.replace("<account>", "123456789012")
        out = self._cdk(tmp_path, "bootstrap", target, cwd=tmp_path)
        # Past the environment check: it stops only at the missing credentials.
        assert "Expected environment name" not in out.stderr, out.stderr
        assert "no credentials have been configured" in out.stderr, out.stderr[-2000:]
        bad = self._cdk(tmp_path, "bootstrap", "aws-cn://123456789012/cn-northwest-1", cwd=tmp_path)
        assert "Expected environment name in format 'aws://<account>/<region>'" in bad.stderr


def _wake_alarms(doc: dict) -> list[dict]:
    alarms = _resources(doc, "AWS::CloudWatch::Alarm").values()
    return [
        a["Properties"] for a in alarms if "while the group was at zero" in a["Properties"].get("AlarmDescription", "")
    ]


def test_a_group_at_zero_wakes_on_the_alb_503s(synthesized, committed):
    for stack in STACK_NAMES:
        doc = _template(synthesized["ningxia-from-zero"], stack)
        (group,) = _resources(doc, "AWS::AutoScaling::AutoScalingGroup").values()
        assert group["Properties"]["MinSize"] == "0"
        (alarm,) = _wake_alarms(doc)
        metrics = {m["Id"]: m for m in alarm["Metrics"]}
        (expression,) = [m["Expression"] for m in metrics.values() if "Expression" in m]
        assert expression == "IF(FILL(served, 0) < 1 AND FILL(refused, 0) > 0, 1, 0)"
        names = {m["MetricStat"]["Metric"]["MetricName"] for m in metrics.values() if "MetricStat" in m}
        assert names == {"HTTPCode_ELB_503_Count", "GroupInServiceInstances"}
        (action,) = alarm["AlarmActions"]
        policy = doc["Resources"][action["Ref"]]["Properties"]
        assert policy["AdjustmentType"] == "ExactCapacity"
        assert policy["StepAdjustments"] == [{"MetricIntervalLowerBound": 0, "ScalingAdjustment": 1}]
        assert not _wake_alarms(committed.template(stack))  # opt-in only


def _door(doc: dict) -> dict | None:
    """The wake door's function, if the stack has one (the rule and its target group come with it)."""
    functions = [r for k, r in _resources(doc, "AWS::Lambda::Function").items() if k.startswith("WakeDoorFunction")]
    return functions[0]["Properties"] if functions else None


def test_a_stack_that_sleeps_answers_through_the_wake_door_and_others_have_none(synthesized, committed, tmp_path):
    for stack in STACK_NAMES:
        for option_set in SYNTHESIZED:  # both wake on a request: from zero, and after off hours on Spot
            doc = _template(synthesized[option_set], stack)
            door = _door(doc)
            assert door is not None, (option_set, stack)
            options = load_options(OPTION_SETS[option_set], tmp_path / "absent.toml")
            wake_s = plan_service(profile_by_stack(stack), options, ZONES).wake_s  # no warm pool in either set
            assert door["Environment"]["Variables"]["WAKE_S"] == str(wake_s)
            (group,) = _resources(doc, "AWS::AutoScaling::AutoScalingGroup")
            # the group's fixed name, so the door does not wait for the group's creation signal
            assert (
                door["Environment"]["Variables"]["GROUP_NAME"]
                == doc["Resources"][group]["Properties"]["AutoScalingGroupName"]
            )
            rules = _resources(doc, "AWS::ElasticLoadBalancingV2::ListenerRule").values()
            (rule,) = [r["Properties"] for r in rules]
            (servers,) = doc["Resources"][group]["Properties"]["TargetGroupARNs"]
            assert rule["Actions"][0]["ForwardConfig"]["TargetGroups"][0] == {"TargetGroupArn": servers, "Weight": 1}
        assert _door(committed.template(stack)) is None, stack  # opt-in only


def test_off_hours_with_wake_leave_the_maximum_so_a_request_can_scale_out(synthesized):
    """The whole app; without wakeOnRequest off hours set the maximum to 0 too: test_fleet_scaling.py."""
    for stack in STACK_NAMES:
        woken = _resources(_template(synthesized["beijing-cost-saver"], stack), "AWS::AutoScaling::ScheduledAction")
        off = [a["Properties"] for a in woken.values() if a["Properties"]["MinSize"] == 0]
        assert len(off) == 1 and off[0]["DesiredCapacity"] == 0 and off[0]["MaxSize"] > 0
        assert _wake_alarms(_template(synthesized["beijing-cost-saver"], stack))  # the backstop of the wake door


def test_wake_on_request_without_a_group_at_zero_is_refused(tmp_path):
    with pytest.raises(DeployOptionError, match="wakeOnRequest.*nothing to wake"):
        load_options({"wakeOnRequest": "true"}, tmp_path / "absent.toml")
    assert load_options({"minCapacity": "0", "wakeOnRequest": "true"}, tmp_path / "absent.toml").min_capacity == 0
