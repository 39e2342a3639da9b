"""`gguf-serve-preflight --probe-mirrors`: the buildspec it gives CodeBuild, run for real by bash against local mirrors
made from Debian's real signed release (tests/mirrors.py), and the calls that create, run and delete the temporary
project and role, against botocore's Stubber (each call checked against the service's API model)."""

from __future__ import annotations

import base64
import json
import os
import subprocess

import pytest
from botocore.stub import Stubber

from gguf_serve.preflight.cli import main
from gguf_serve.preflight.mirror_probe import (
    PERMISSIONS,
    POLL_S,
    VARIABLE,
    ProbeBuild,
    buildspec,
    probe_mirrors,
    verdicts,
)
from gguf_serve.preflight.results import Status
from tests import mirrors
from tests.mirrors import mirror
from tests.preflight.account import REGION, Account, Session, make_clients

release, served = mirrors.release, mirrors.served  # the fixtures
ROLE_ARN = "arn:aws-cn:iam::111122223333:role/gguf-serve-mirror-probe"
GOOD = "https://mirrors.tuna.tsinghua.edu.cn/debian"
LOG = "\n".join(
    [
        "pick-mirror: https://mirrors.aliyun.com/debian: no answer for dists/trixie/InRelease",
        "pick-mirror: no mirror of https://mirrors.aliyun.com/debian answered with the signed trixie release; ...",
        f"pick-mirror: {GOOD}: release signed, main/binary-amd64/Packages.xz 9.7 MB in 0.4 s (22.74 MB/s): using it",
        "pick-mirror: https://mirrors.ustc.edu.cn/debian: main/binary-amd64/Packages.xz does not match its signed "
        "release (a mirror in the middle of a sync?)",
        "pick-mirror: https://mirrors.huaweicloud.com/debian: release signed, main/binary-amd64/Packages.xz 9.7 MB in "
        "1.9 s (5.10 MB/s): using it",
    ]
)


def test_the_buildspec_runs_the_build_s_probe_once_per_mirror_and_exports_every_verdict(served, release, tmp_path):
    root, url = served
    names = [mirror(root, name, release, damage) for name, damage in (("forged", "signature"), ("good", None))]
    listed = ("http://127.0.0.1:9/debian", *(f"{url}/{n}" for n in names))
    spec = buildspec()
    assert spec["version"] == "0.2" and spec["env"] == {"shell": "bash", "exported-variables": [VARIABLE]}
    (command,) = spec["phases"]["build"]["commands"]
    exported = tmp_path / "exported"
    # As CodeBuild runs it: bash, the mirrors in the project's environment, an empty working directory.
    env = {**os.environ, "DEBIAN_MIRRORS": " ".join(listed), "MIRROR_CONNECT_TIMEOUT_S": "5", "TMPDIR": str(tmp_path)}
    out = subprocess.run(["bash", "-c", f'{command}\nprintf %s "${VARIABLE}" > {exported}'], env=env, cwd=tmp_path,
                         capture_output=True, text=True, timeout=180)  # fmt: skip
    assert out.returncode == 0, out.stderr
    log = base64.b64decode(exported.read_text()).decode()
    assert log == out.stdout  # the build log shows what is exported
    results = _probe_results(log, listed)
    assert [r.status for r in results] == [Status.WARN, Status.WARN, Status.OK, Status.OK]
    assert "no answer for dists/trixie/InRelease" in results[0].detail
    assert "not signed by the pinned keyring" in results[1].detail
    assert results[2].detail.startswith("release signed, main/binary-amd64/Packages.xz") and "MB/s" in results[2].detail
    assert results[3].detail.startswith(f"the roots stage would bootstrap from {url}/good at ")


def _probe_results(log: str, listed: tuple[str, ...]):
    return verdicts(listed, log, REGION)


def test_every_mirror_gets_a_verdict_and_the_first_that_passes_is_the_build_s(plan):
    results = _probe_results(LOG, plan.debian_mirrors)
    by_check = {r.check: r for r in results}
    assert [by_check[f"mirror {m}"].status for m in plan.debian_mirrors] == [Status.WARN, Status.OK, Status.WARN,
                                                                              Status.OK]  # fmt: skip
    summary = by_check["Debian mirror from CodeBuild"]
    assert summary.status is Status.OK
    assert summary.detail == f"the roots stage would bootstrap from {GOOD} at 22.74 MB/s"
    none = _probe_results(LOG.replace(": using it", ": refused"), plan.debian_mirrors)[-1]
    assert none.status is Status.BLOCKER and "the roots stage would fail" in none.detail
    assert "debianMirrors" in none.todo


def _captured(client, operation: str) -> list[dict]:
    seen: list[dict] = []
    client.meta.events.register(f"provide-client-params.{client.meta.service_model.endpoint_prefix}.{operation}",
                                lambda params, **_: seen.append(params))  # fmt: skip
    return seen


def _stub_probe(iam: Stubber, codebuild: Stubber, name: str, *, final: dict, slow_role: bool = False) -> None:
    role = {"Path": "/", "RoleName": name, "RoleId": "AROAEXAMPLEPROBE", "Arn": ROLE_ARN,
            "CreateDate": "2026-01-01T00:00:00Z"}  # fmt: skip
    iam.add_response("create_role", {"Role": role})
    if slow_role:  # IAM has not yet told CodeBuild about the new role
        codebuild.add_client_error("create_project", "InvalidInputException",
                                   "CodeBuild is not authorized to perform: sts:AssumeRole on " + ROLE_ARN)  # fmt: skip
    codebuild.add_response("create_project", {"project": {"name": name}})
    codebuild.add_response("start_build", {"build": {"id": f"{name}:1"}}, {"projectName": name})
    codebuild.add_response("batch_get_builds", {"builds": [{"id": f"{name}:1", "currentPhase": "BUILD",
                                                            "buildComplete": False}]})  # fmt: skip
    codebuild.add_response("batch_get_builds", {"builds": [{"id": f"{name}:1", **final}]})


def _exported(log: str) -> dict:
    value = base64.b64encode(log.encode()).decode()
    return {"buildStatus": "SUCCEEDED", "buildComplete": True,
            "exportedEnvironmentVariables": [{"name": VARIABLE, "value": value}]}  # fmt: skip


@pytest.fixture
def probe(plan):
    made = make_clients()
    stubs = {name: Stubber(made[name]) for name in ("iam", "codebuild")}
    build = ProbeBuild.for_plan(plan)
    assert build is not None
    yield made, stubs, build
    for stub in stubs.values():
        stub.assert_no_pending_responses()


def test_the_probe_makes_a_project_without_permissions_or_logs_runs_it_once_and_deletes_it(plan, probe):
    made, stubs, build = probe
    _stub_probe(stubs["iam"], stubs["codebuild"], build.name, final=_exported(LOG), slow_role=True)
    stubs["codebuild"].add_response("delete_project", {}, {"name": build.name})
    stubs["iam"].add_response("delete_role", {}, {"RoleName": build.name})
    roles, projects = _captured(made["iam"], "CreateRole"), _captured(made["codebuild"], "CreateProject")
    for stub in stubs.values():
        stub.activate()
    slept: list[float] = []
    results = probe_mirrors(plan, made.__getitem__, build=build, sleep=slept.append)
    assert results[-1].detail == f"the roots stage would bootstrap from {GOOD} at 22.74 MB/s"
    assert slept == [6, POLL_S]  # one retry while IAM propagates the role, one poll
    (trust,) = json.loads(roles[0]["AssumeRolePolicyDocument"])["Statement"]
    assert trust == {"Effect": "Allow", "Principal": {"Service": "codebuild.amazonaws.com"}, "Action": "sts:AssumeRole"}
    assert "PolicyArns" not in roles[0] and "PermissionsBoundary" not in roles[0]
    project = projects[-1]
    x86 = {image for s in plan.stacks for kind, image, _ in s.build_images if kind == "LINUX_CONTAINER"}
    assert project["environment"]["image"] in x86 and project["environment"]["computeType"] == "BUILD_GENERAL1_LARGE"
    assert project["environment"]["environmentVariables"] == [
        {"name": "DEBIAN_MIRRORS", "value": " ".join(plan.debian_mirrors), "type": "PLAINTEXT"}
    ]
    assert project["source"] == {"type": "NO_SOURCE", "buildspec": json.dumps(buildspec())}
    assert project["logsConfig"] == {"cloudWatchLogs": {"status": "DISABLED"}, "s3Logs": {"status": "DISABLED"}}
    assert project["serviceRole"] == ROLE_ARN
    assert project["timeoutInMinutes"] == 18  # 5 to provision, then 4 mirrors at worst 15 s + 180 s each


def test_a_failed_build_is_a_warning_with_its_reason_and_both_are_still_deleted(plan, probe):
    made, stubs, build = probe
    phases = [{"phaseType": "PROVISIONING", "phaseStatus": "FAILED",
               "contexts": [{"statusCode": "CLIENT_ERROR", "message": "image not found"}]}]  # fmt: skip
    _stub_probe(stubs["iam"], stubs["codebuild"], build.name,
                final={"buildStatus": "FAILED", "buildComplete": True, "phases": phases})  # fmt: skip
    stubs["codebuild"].add_response("delete_project", {}, {"name": build.name})
    stubs["iam"].add_response("delete_role", {}, {"RoleName": build.name})
    for stub in stubs.values():
        stub.activate()
    (r,) = probe_mirrors(plan, made.__getitem__, build=build, sleep=lambda s: None)
    assert r.status is Status.WARN and r.detail == f"build {build.name}:1 FAILED: PROVISIONING: image not found"


def test_a_build_that_never_ends_is_stopped_and_what_cannot_be_deleted_is_named(plan, probe):
    made, stubs, build = probe
    _stub_probe(stubs["iam"], stubs["codebuild"], build.name, final={"currentPhase": "BUILD", "buildComplete": False})
    stubs["codebuild"].add_response("stop_build", {"build": {"id": f"{build.name}:1"}}, {"id": f"{build.name}:1"})
    stubs["codebuild"].add_response("delete_project", {}, {"name": build.name})
    stubs["iam"].add_client_error("delete_role", "AccessDenied", "not allowed to delete roles")
    for stub in stubs.values():
        stub.activate()
    clock = iter([0.0, 1.0, 1e9])
    results = probe_mirrors(plan, made.__getitem__, build=build, sleep=lambda s: None, clock=lambda: next(clock))
    assert [r.detail for r in results][0] == f"build {build.name}:1 did not finish in time; stopped"
    assert results[1].detail.startswith(f"left behind: IAM role {build.name} (") and "delete it" in results[1].todo


def test_without_permission_to_create_the_role_nothing_is_made_and_the_warning_lists_what_is_needed(plan, probe):
    made, stubs, build = probe
    stubs["iam"].add_client_error("create_role", "AccessDenied", "not allowed")
    for stub in stubs.values():
        stub.activate()
    (r,) = probe_mirrors(plan, made.__getitem__, build=build)
    assert r.status is Status.WARN and r.detail.startswith("could not start:") and PERMISSIONS in r.todo


def test_the_command_says_the_probe_is_not_read_only_and_a_probe_without_a_good_mirror_blocks(plan, capsys,
                                                                                            monkeypatch):  # fmt: skip
    monkeypatch.setattr("gguf_serve.preflight.cli.deploy_plan", lambda stacks, context=None: plan)
    account = Account(plan)
    made = account.clients()  # the read-only checks' answers, then the probe's
    iam, codebuild = account.stubs["iam"], account.stubs["codebuild"]
    iam.add_response("create_role", {"Role": {"Path": "/", "RoleName": "probe", "RoleId": "AROAEXAMPLEPROBE",
                                              "Arn": ROLE_ARN, "CreateDate": "2026-01-01T00:00:00Z"}})  # fmt: skip
    codebuild.add_response("create_project", {"project": {"name": "probe"}})
    codebuild.add_response("start_build", {"build": {"id": "probe:1"}})
    codebuild.add_response("batch_get_builds", {"builds": [{"id": "probe:1", **_exported(LOG.replace("using", "x"))}]})
    codebuild.add_response("delete_project", {})
    iam.add_response("delete_role", {})
    assert main(["--probe-mirrors"], session=Session(made)) == 1
    out = capsys.readouterr().out
    assert "--probe-mirrors is not read-only: it creates IAM role gguf-serve-mirror-probe-" in out.splitlines()[1]
    (row,) = [line.split() for line in out.splitlines() if line.startswith("Debian mirror from CodeBuild")]
    assert row[4] == "BLOCKER" and "1 blocker(s), 4 warning(s)" in out  # a warning per mirror
