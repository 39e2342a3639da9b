"""The pre-flight against a passing account and one failing account per check (tests/preflight/account.py: botocore's
Stubber on real boto3 clients; the network quotas and endpoint zones: test_network.py)."""

from __future__ import annotations

import pytest

from gguf_serve.preflight.checks import Status
from gguf_serve.preflight.cli import main
from gguf_serve.preflight.plan import G_AND_VT_ON_DEMAND, STANDARD_ON_DEMAND, deploy_plan
from tests.conftest import cdk_context
from tests.preflight.account import Account, Session


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
    results = account.check()
    # A lagging listing is a warning, not a blocker: StartBuild itself refuses an image the region lacks.
    assert not [r for r in _by_status(results, Status.BLOCKER) if r.check.startswith("CodeBuild")]
    warns = [r for r in _by_status(results, Status.WARN) if dropped in r.detail]
    assert warns and all(w.check.startswith("CodeBuild") and "curated image listing" in w.detail for w in warns)
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
    assert main([], session=Session(Account(plan).clients())) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[2].split()[:4] == ["check", "result", "detail", "what"]
    assert "0 blocker(s), 0 warning(s)" in out
    broken = Account(plan)
    broken.bootstrap_status = None
    assert main([], session=Session(broken.clients())) == 1
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
    codes = {s.stack_name: (s.quota_code, s.spot_quota_code) for s in spot.stacks}
    assert codes == {"IntelMoeStack": (STANDARD_ON_DEMAND, "L-34B43A08"), "GpuMtpStack": (G_AND_VT_ON_DEMAND, "")}
    (intel,) = [s for s in spot.stacks if s.stack_name == "IntelMoeStack"]
    # Spot: no warm pool; the first instance and an update's run On-Demand (the base), the rest of a scale-out on Spot
    assert intel.vcpus == {"create": 16, "update": 32, "scale_out": 32}
    assert intel.spot_vcpus == {"create": 0, "update": 0, "scale_out": 32}
    assert intel.zones == ("cn-northwest-1a", "cn-northwest-1b")


def test_a_spot_stack_needs_on_demand_quota_for_its_base_and_spot_quota_only_to_scale_out(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text("spot = true\n")
    plan = deploy_plan(["IntelMoeStack"], config_file=config, context=cdk_context())
    account = Account(plan)
    account.quotas = {STANDARD_ON_DEMAND: 32.0, "L-34B43A08": 0.0}  # the base fits; no Spot quota at all
    quotas = {r.check.split()[-1]: r for r in account.check() if r.check.startswith("vCPU quota")}
    assert quotas[STANDARD_ON_DEMAND].status is Status.OK, quotas  # 16 at create, 32 during an update
    spot = quotas["L-34B43A08"]
    assert spot.status is Status.WARN and "L-34B43A08 >= 32" in spot.todo, spot  # scale-out only: not a blocker


def test_a_spot_alternative_missing_from_a_zone_is_a_warning_the_main_type_a_blocker(tmp_path):
    config = tmp_path / "deploy.toml"
    config.write_text("spot = true\n")
    plan = deploy_plan(["IntelMoeStack"], config_file=config, context=cdk_context())
    (intel,) = plan.stacks
    assert intel.spot_instance_types == ("m8i.4xlarge",)  # profiles/serving/intel-moe.toml
    account = Account(plan)
    account.quotas["L-34B43A08"] = 64.0  # Spot vCPUs
    account.offered_zones["m8i.4xlarge"] = {"cn-northwest-1a"}
    zones = {r.check: r for r in account.check() if r.check.endswith("in zones")}
    alternative = zones["m8i.4xlarge (Spot alternative) in zones"]
    assert alternative.status is Status.WARN and "not offered in cn-northwest-1b" in alternative.detail, alternative
    assert zones["c8i.4xlarge in zones"].status is Status.OK
    account = Account(plan)
    account.quotas["L-34B43A08"] = 64.0
    account.offered_zones["c8i.4xlarge"] = {"cn-northwest-1a"}
    main_type = {r.check: r for r in account.check()}["c8i.4xlarge in zones"]
    assert main_type.status is Status.BLOCKER


@pytest.mark.parametrize("entry", ["typed", "none"])
def test_a_refused_stack_is_one_blocker_and_still_checked_for_what_the_account_needs(monkeypatch, tmp_path, entry):
    """The hub is down and the 27B has a typed entry without sha256 (the committed lock), or no entry at all: the
    CLI refuses GpuMtpStack; the pre-flight says so in one BLOCKER line and still checks its AMI, zones, G quota
    and image sources (without an entry there is no model to plan the volume from, and its image build is checked
    only through another selected stack of the same image target)."""
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the lookup fails at once
    # allowTypedLock: the 35B's typed sha256 deploys on purpose; only the 27B, which has none, is refused
    lock = {
        "modelLock": str(_committed_lock_copy(drop="Qwen3.6-27B" if entry == "none" else None)),
        "allowTypedLock": "true",
    }
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
    assert [r.check for r in blockers] == ["refused GpuMtpStack"]
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
