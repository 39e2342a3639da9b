"""The pre-flight against a passing account and one failing account per check.

The account is botocore's Stubber on real boto3 clients: each call is validated against the service's API model
(parameter names and types, response shapes), and the answers are the ones each service documents.
"""

from __future__ import annotations

from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from gguf_serve.preflight.checks import BOOTSTRAP_VERSION_PARAMETER, Status, run_checks
from gguf_serve.preflight.cli import main
from gguf_serve.preflight.plan import G_AND_VT_ON_DEMAND, STANDARD_ON_DEMAND, deploy_plan
from tests.conftest import cdk_context

REGION = "cn-northwest-1"


@pytest.fixture(scope="module")
def plan():
    return deploy_plan(context=cdk_context())  # the tests' lock: the 27B pinned, so every stack is checked


class Account:
    """A China account with everything the stacks need; tests break one thing at a time."""

    def __init__(self, plan) -> None:
        self.plan = plan
        # Each AMI's root snapshot 40 GiB under the planned volume: what the catalog expects.
        self.ami = {
            s.ami_parameter: (f"ami-{i:017x}", s.architecture, s.root_volume_gib - 40)
            for i, s in enumerate(plan.stacks)
        }
        self.missing_parameters: set[str] = set()
        self.offered_zones = {s.instance_type: set(s.zones) | {"cn-northwest-1c"} for s in plan.stacks}
        # Enough for every stack at full scale-out, summed per quota (the README's quota table)
        self.quotas = {STANDARD_ON_DEMAND: 512.0, G_AND_VT_ON_DEMAND: 64.0}
        self.curated = {image for s in plan.stacks for _, image, _ in s.build_images}
        self.build_concurrency = 1.0
        self.bootstrap_status: str | None = "UPDATE_COMPLETE"
        self.bootstrap_version = max(s.bootstrap_version for s in plan.stacks)
        self.endpoint_services = {n for s in plan.stacks for n in s.endpoint_services} | {"com.amazonaws.x.other"}
        self.lambda_unreserved = 1000

    def clients(self) -> dict[str, Any]:
        made = {}
        for service in ("sts", "ssm", "ec2", "service-quotas", "codebuild", "cloudformation", "lambda"):
            made[service] = boto3.client(
                service, region_name=REGION, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x"
            )
        stub = {name: Stubber(c) for name, c in made.items()}
        stub["sts"].add_response(
            "get_caller_identity",
            {
                "Account": "111122223333",
                "Arn": "arn:aws-cn:iam::111122223333:user/reader",
                "UserId": "AIDAEXAMPLEREADER",
            },
        )
        for s in self.plan.stacks:
            if s.ami_parameter in self.missing_parameters:
                stub["ssm"].add_client_error(
                    "get_parameter", "ParameterNotFound", expected_params={"Name": s.ami_parameter}
                )  # noqa: E501
                continue
            image_id, arch, size = self.ami[s.ami_parameter]
            stub["ssm"].add_response("get_parameter", {"Parameter": {"Name": s.ami_parameter, "Value": image_id}},
                                     {"Name": s.ami_parameter})  # fmt: skip
            stub["ec2"].add_response(
                "describe_images",
                {"Images": [{"ImageId": image_id, "Architecture": arch, "RootDeviceName": "/dev/xvda",
                             "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": size}}]}]},
                {"ImageIds": [image_id]},
            )  # fmt: skip
        for s in self.plan.stacks:
            offers = [{"InstanceType": s.instance_type, "LocationType": "availability-zone", "Location": z}
                      for z in sorted(self.offered_zones[s.instance_type])]  # fmt: skip
            stub["ec2"].add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": offers})
        for code in sorted({s.quota_code for s in self.plan.stacks}):
            stub["service-quotas"].add_response(
                "get_service_quota",
                {"Quota": {"QuotaCode": code, "QuotaName": f"Running On-Demand {code}", "Value": self.quotas[code]}},
                {"ServiceCode": "ec2", "QuotaCode": code},
            )
        if self.curated or any(s.build_images for s in self.plan.stacks):
            images = [{"name": n, "description": "", "versions": []} for n in sorted(self.curated)]
            stub["codebuild"].add_response(
                "list_curated_environment_images",
                {
                    "platforms": [
                        {"platform": "AMAZON_LINUX_2023", "languages": [{"language": "STANDARD", "images": images}]}
                    ]
                },  # noqa: E501
            )
            quotas = [
                {"QuotaCode": f"L-{kind}{size}", "Value": self.build_concurrency, "ServiceCode": "codebuild",
                 "QuotaName": f"Concurrently running builds for {kind}/{size} environment"}
                for kind in ("Linux", "ARM") for size in ("Small", "Medium", "Large", "XLarge", "2XLarge")
            ]  # fmt: skip
            stub["service-quotas"].add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "codebuild"})
        if self.bootstrap_status is None:
            stub["cloudformation"].add_client_error(
                "describe_stacks", "ValidationError", "Stack with id CDKToolkit does not exist"
            )
        else:
            stub["cloudformation"].add_response(
                "describe_stacks",
                {"Stacks": [{"StackName": "CDKToolkit", "StackStatus": self.bootstrap_status,
                             "CreationTime": "2026-01-01T00:00:00Z"}]},
                {"StackName": "CDKToolkit"},
            )  # fmt: skip
            if self.bootstrap_status.endswith("_COMPLETE") and "ROLLBACK" not in self.bootstrap_status:
                stub["ssm"].add_response(
                    "get_parameter",
                    {"Parameter": {"Name": BOOTSTRAP_VERSION_PARAMETER, "Value": str(self.bootstrap_version)}},
                    {"Name": BOOTSTRAP_VERSION_PARAMETER},
                )
        stub["ec2"].add_response("describe_vpc_endpoint_services", {"ServiceNames": sorted(self.endpoint_services)})
        stub["lambda"].add_response(
            "get_account_settings",
            {"AccountLimit": {"ConcurrentExecutions": 1000, "UnreservedConcurrentExecutions": self.lambda_unreserved}},
        )
        for s in stub.values():
            s.activate()
        self.stubs = stub
        return made

    def check(self):
        made = self.clients()
        results = run_checks(self.plan, lambda service: made[service])
        for name, s in self.stubs.items():
            if name != "sts":
                s.assert_no_pending_responses()
        return results


def _by_status(results, status):
    return [r for r in results if r.status is status]


def test_a_ready_account_passes_every_check(plan):
    results = Account(plan).check()
    assert _by_status(results, Status.BLOCKER) == [] and _by_status(results, Status.WARN) == []
    checked = {r.check.split()[0] for r in results}
    assert {"AMI", "vCPU", "CDK", "VPC"} <= checked
    assert len([r for r in results if r.check.startswith("AMI")]) == len(plan.stacks)


def _blocker(results, starts: str):
    found = [r for r in _by_status(results, Status.BLOCKER) if r.check.startswith(starts)]
    assert found, [r for r in results if r.status is not Status.OK]
    return found[0]


def test_missing_ami_parameter(plan):
    account = Account(plan)
    gpu = next(s for s in plan.stacks if s.stack_name == "GpuMtpStack")
    account.missing_parameters.add(gpu.ami_parameter)
    r = _blocker(account.check(), "AMI GpuMtpStack")
    assert "does not exist in cn-northwest-1" in r.detail and "profiles/hardware.toml" in r.todo


def test_ami_snapshot_larger_than_the_volume(plan):
    account = Account(plan)
    gpu = next(s for s in plan.stacks if s.stack_name == "GpuMtpStack")
    image_id, arch, _ = account.ami[gpu.ami_parameter]
    account.ami[gpu.ami_parameter] = (image_id, arch, gpu.root_volume_gib + 1)
    r = _blocker(account.check(), "AMI GpuMtpStack")
    assert f"root snapshot is {gpu.root_volume_gib + 1} GiB" in r.detail
    assert f"root_snapshot_gib = {gpu.root_volume_gib + 1}" in r.todo


def test_ami_of_the_wrong_architecture(plan):
    account = Account(plan)
    graviton = next(s for s in plan.stacks if s.stack_name == "GravitonMoeStack")
    image_id, _, size = account.ami[graviton.ami_parameter]
    account.ami[graviton.ami_parameter] = (image_id, "x86_64", size)
    assert "is x86_64" in _blocker(account.check(), "AMI GravitonMoeStack").detail


def test_instance_type_missing_from_a_pinned_zone(plan):
    account = Account(plan)
    graviton = next(s for s in plan.stacks if s.stack_name == "GravitonMoeStack")
    account.offered_zones[graviton.instance_type] = {"cn-northwest-1c"}
    r = _blocker(account.check(), graviton.instance_type)
    assert graviton.zones[0] in r.detail and "pinned-availability-zones" in r.todo


def test_gpu_quota_too_small_for_a_rolling_update(plan):
    account = Account(plan)
    gpu = next(s for s in plan.stacks if s.stack_name == "GpuMtpStack")
    account.quotas[G_AND_VT_ON_DEMAND] = float(gpu.vcpus["create"])  # enough to create, not to update
    r = _blocker(account.check(), "vCPU quota")
    assert f"{gpu.vcpus['update']} during a rolling update" in r.detail
    assert f"{G_AND_VT_ON_DEMAND} >= {gpu.vcpus['update']}" in r.todo


def test_standard_quota_adds_up_both_cpu_stacks_and_warns_below_scale_out(plan):
    account = Account(plan)
    cpu = [s for s in plan.stacks if s.quota_code == STANDARD_ON_DEMAND]
    update = sum(s.vcpus["update"] for s in cpu)
    account.quotas[STANDARD_ON_DEMAND] = float(update)
    results = account.check()
    (warn,) = [r for r in _by_status(results, Status.WARN) if r.check.startswith("vCPU quota")]
    assert (
        "GravitonMoeStack+IntelMoeStack" in warn.detail and f"need {sum(s.vcpus['create'] for s in cpu)}" in warn.detail
    )  # noqa: E501
    account = Account(plan)
    account.quotas[STANDARD_ON_DEMAND] = float(update - 1)
    _blocker(account.check(), "vCPU quota")


def test_codebuild_image_not_offered_and_no_build_concurrency(plan):
    if not any(s.build_images for s in plan.stacks):
        pytest.skip("no CodeBuild project in this build design")
    account = Account(plan)
    dropped = sorted(account.curated)[0]
    account.curated.discard(dropped)
    r = _blocker(account.check(), "CodeBuild")
    assert dropped in r.detail
    account = Account(plan)
    account.build_concurrency = 0.0
    assert "no build can run" in _blocker(account.check(), "CodeBuild concurrency").detail


def test_account_not_bootstrapped(plan):
    account = Account(plan)
    account.bootstrap_status = None
    r = _blocker(account.check(), "CDK bootstrap")
    assert r.todo == "npx cdk bootstrap aws://<account>/cn-northwest-1"


def test_bootstrap_too_old_or_broken(plan):
    account = Account(plan)
    account.bootstrap_version = 2
    assert "version 2, the templates need" in _blocker(account.check(), "CDK bootstrap").detail
    account = Account(plan)
    account.bootstrap_status = "UPDATE_ROLLBACK_FAILED"
    assert "UPDATE_ROLLBACK_FAILED" in _blocker(account.check(), "CDK bootstrap").detail


def test_missing_endpoint_service(plan):
    account = Account(plan)
    gone = next(n for n in sorted(account.endpoint_services) if "ecr.dkr" in n)
    account.endpoint_services.discard(gone)
    assert gone in _blocker(account.check(), "VPC endpoint").detail


class _Session:
    def __init__(self, made: dict[str, Any]) -> None:
        self.made = made

    def client(self, service: str, region_name: str):
        assert region_name == REGION
        return self.made[service]


def test_lambda_concurrency_all_reserved_blocks_the_image_build_and_the_wake_door(plan):
    account = Account(plan)
    account.lambda_unreserved = 0
    r = _blocker(account.check(), "Lambda concurrency")
    assert r.detail.startswith("0 of 1000 concurrent executions unreserved") and "reserved concurrency" in r.todo


def test_a_wake_door_is_counted_when_the_option_adds_it():
    options = {"minCapacity": "0", "wakeOnRequest": "true"}
    woken = deploy_plan(["IntelMoeStack", "GpuMtpStack"], context={**cdk_context(), **options})
    assert all(any(f.startswith("WakeDoorFunction") for f in s.functions) for s in woken.stacks)
    (ok,) = [r for r in Account(woken).check() if r.check == "Lambda concurrency"]
    assert ok.status is Status.OK and f"{len(woken.stacks)} wake door(s)" in ok.detail


def test_the_command_prints_one_table_and_exits_by_blockers(plan, capsys, monkeypatch):
    monkeypatch.setattr("gguf_serve.preflight.cli.deploy_plan", lambda stacks, context=None: plan)
    assert main([], session=_Session(Account(plan).clients())) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[:4] == ["check", "result", "detail", "what"]
    assert "0 blocker(s), 0 warning(s)" in out
    broken = Account(plan)
    broken.bootstrap_status = None
    assert main([], session=_Session(broken.clients())) == 1
    assert "BLOCKER" in capsys.readouterr().out


def test_no_credentials_is_one_line(plan, capsys, monkeypatch):
    monkeypatch.setattr("gguf_serve.preflight.cli.deploy_plan", lambda stacks, context=None: plan)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/nonexistent")
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    assert main([]) == 2
    assert capsys.readouterr().err.startswith("error: cannot reach the account")


def test_plan_reads_deploy_options(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text("spot = true\n")
    spot = deploy_plan(["IntelMoeStack", "GpuMtpStack"], config_file=config, context=cdk_context())
    codes = {s.stack_name: s.quota_code for s in spot.stacks}
    assert codes == {"IntelMoeStack": "L-34B43A08", "GpuMtpStack": G_AND_VT_ON_DEMAND}
    (intel,) = [s for s in spot.stacks if s.stack_name == "IntelMoeStack"]
    assert intel.vcpus["create"] == 16  # Spot: no warm pool, so one instance at create
    assert intel.zones == ("cn-northwest-1a", "cn-northwest-1b")


@pytest.mark.parametrize("entry", ["typed", "none"])
def test_a_refused_stack_is_one_blocker_and_still_checked_for_what_the_account_needs(monkeypatch, tmp_path, entry):
    """The hub is down and the 27B has a typed entry without sha256 (the committed lock), or no entry at all: the
    CLI refuses GpuMtpStack; the pre-flight says so in one BLOCKER line and still checks its AMI, zones, G quota
    and image sources (without an entry there is no model to plan the volume from, and its image build is checked
    only through another selected stack of the same image target)."""
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the lookup fails at once
    lock = {"modelLock": str(_committed_lock_copy(drop="Qwen3.6-27B" if entry == "none" else None))}
    plan = deploy_plan(["GravitonMoeStack", "GpuMtpStack"], context=lock, config_file=tmp_path / "absent.toml")
    (gpu,) = [s for s in plan.stacks if s.stack_name == "GpuMtpStack"]
    assert bool(gpu.build_images) == (entry == "typed") and gpu.zones == ("cn-northwest-1a", "cn-northwest-1b")
    assert (gpu.root_volume_gib == 0) == (entry == "none") and gpu.vcpus["update"] == 12
    assert sorted(s.stack_name for s in plan.stacks) == ["GpuMtpStack", "GravitonMoeStack"]
    ((name, why),) = plan.refused
    assert name == "GpuMtpStack" and "gguf-serve-catalog lock Qwen3.6-27B" in why and "127.0.0.1:9" in why
    assert "\n" not in why
    results = Account(plan).check()
    blockers = [r for r in results if r.status is Status.BLOCKER]
    assert [r.check for r in blockers] == ["model GpuMtpStack"]
    checked = {r.check for r in results if r.status is Status.OK}
    assert {"AMI GravitonMoeStack", "AMI GpuMtpStack", "g5.xlarge in zones"} <= checked
    assert any(r.check.startswith("vCPU quota") and G_AND_VT_ON_DEMAND in r.check for r in results)


def _committed_lock_copy(drop: str | None = None):
    import tempfile
    from pathlib import Path

    from gguf_serve.catalog.lockfile import read_lock, render_lock
    from tests.conftest import ROOT

    entries = read_lock(ROOT / "profiles" / "models.lock.toml")
    entries.pop(drop or "", None)
    lock = Path(tempfile.mkdtemp(prefix="lock-")) / "models.lock.toml"
    lock.write_text(render_lock(entries))
    return lock


def test_context_options_reach_the_plan(capsys, monkeypatch):
    seen = {}

    def fake_plan(stacks, context=None):
        seen.update(context or {})
        raise SystemExit(0)

    monkeypatch.setattr("gguf_serve.preflight.cli.deploy_plan", fake_plan)
    with pytest.raises(SystemExit):
        main(["-c", "spot=true", "-c", "modelLock=x.toml", "GravitonMoeStack"])
    assert seen == {"spot": "true", "modelLock": "x.toml"}
