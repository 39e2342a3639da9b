"""`gguf-serve-preflight --probe-mirrors`: docker/pick-mirror.sh, the build's own mirror probe, run by CodeBuild in
the account against each of the debianMirrors, on the image and compute type the roots stage uses.

Unlike every other check this one is not read-only, and it costs a few build minutes. It creates an IAM role that
only CodeBuild may assume and that holds no permission, and a CodeBuild project without source, artifacts or logs;
runs one build; and deletes both, also when the build fails or the run is interrupted. A temporary project rather
than the stacks' own: the probe matters most before the first deploy, when no stack's project exists (and a first
deploy that fails rolls its project back). The role needs no permission because the probe reads public mirrors
only, and its verdicts come back in the build's exported variable (BatchGetBuilds), not through CloudWatch Logs.
"""

from __future__ import annotations

import base64
import json
import math
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.catalog.images import IMAGE_TARGETS, stage_compute
from gguf_serve.preflight.plan import DeployPlan
from gguf_serve.preflight.results import Clients, Result, Status
from stacks.image_inputs import ROOT

SCRIPT = ROOT / "docker" / "pick-mirror.sh"
KEYRING = ROOT / "docker" / "keyrings" / "debian-trixie.gpg"  # the name pick-mirror.sh reads beside itself
VARIABLE = "MIRROR_PROBE"
# pick-mirror.sh gives a mirror at most 15 s to answer and 180 s for its index (MIRROR_*_TIMEOUT_S): the build's
# limit is that per mirror plus 5 minutes to provision, 18 minutes for the four default mirrors.
MIRROR_WORST_S = 15 + 180
QUEUED_TIMEOUT_MIN = 10
POLL_S = 10
# CodeBuild's service principal, as CDK renders it in aws-cn as in aws (the stacks' build role trusts the same).
_TRUST = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Principal": {"Service": "codebuild.amazonaws.com"}, "Action": "sts:AssumeRole"}],
}
PERMISSIONS = (
    "iam:CreateRole, iam:DeleteRole, iam:PassRole, codebuild:CreateProject, codebuild:StartBuild, "
    "codebuild:BatchGetBuilds, codebuild:StopBuild, codebuild:DeleteProject"
)


@dataclass(frozen=True)
class ProbeBuild:
    """What the probe runs: the roots stage's environment and the configured mirrors."""

    name: str
    image: str
    compute: str
    mirrors: tuple[str, ...]

    @classmethod
    def for_plan(cls, plan: DeployPlan) -> ProbeBuild | None:
        images = sorted({i for s in plan.planned() for kind, i, _ in s.build_images if kind == "LINUX_CONTAINER"})
        if not images:
            return None
        compute = stage_compute(IMAGE_TARGETS["x86-64-cpu"], "roots")
        return cls(f"gguf-serve-mirror-probe-{secrets.token_hex(4)}", images[0], compute, plan.debian_mirrors)

    @property
    def timeout_min(self) -> int:
        return min(2160, 5 + math.ceil(len(self.mirrors) * MIRROR_WORST_S / 60))  # CreateProject takes 5-2160

    def describe(self) -> str:
        return (
            f"--probe-mirrors is not read-only: it creates IAM role {self.name} (CodeBuild may assume it; it holds "
            f"no permission) and CodeBuild project {self.name}, runs one build on {self.image} ({self.compute}, "
            "billed per build minute: a few minutes), then deletes both"
        )


def buildspec() -> dict:
    """The probe's whole build: the script and the pinned keyring, carried in the buildspec (the project has no
    source), run once per mirror so that each gets a verdict; the verdicts are exported, base64, in VARIABLE."""
    script = base64.b64encode(SCRIPT.read_bytes()).decode()
    keyring = base64.b64encode(KEYRING.read_bytes()).decode()
    command = "\n".join(
        [
            'probe="$(mktemp -d)" && mkdir -p "$probe/keyrings"',
            f"echo '{script}' | base64 -d > \"$probe/pick-mirror.sh\"",
            f"echo '{keyring}' | base64 -d > \"$probe/keyrings/{KEYRING.name}\"",
            'read -r -a mirrors <<<"$DEBIAN_MIRRORS"',
            'for mirror in "${mirrors[@]}"; do',
            '  DEBIAN_MIRRORS="$mirror" bash "$probe/pick-mirror.sh" >/dev/null 2>>"$probe/verdicts" || true',
            "done",
            f'cat "$probe/verdicts"; {VARIABLE}="$(base64 -w0 < "$probe/verdicts")"',
        ]
    )
    return {
        "version": "0.2",
        "env": {"shell": "bash", "exported-variables": [VARIABLE]},
        "phases": {"build": {"commands": [command]}},
    }


def verdicts(mirrors: tuple[str, ...], log: str, region: str) -> list[Result]:
    """One line per mirror from pick-mirror.sh's log, then the mirror the roots stage would take (the first, in
    order, that passed)."""
    lines = [line.removeprefix("pick-mirror: ") for line in log.splitlines() if line.startswith("pick-mirror: ")]
    results, chosen = [], None
    for mirror in mirrors:
        said = [line.removeprefix(f"{mirror}: ") for line in lines if line.startswith(f"{mirror}: ")]
        if not said:
            results.append(Result(f"mirror {mirror}", Status.WARN, "no verdict in the probe's log"))
        elif said[0].endswith("using it"):
            chosen = chosen or mirror
            results.append(Result(f"mirror {mirror}", Status.OK, said[0].removesuffix(": using it")))
        else:
            results.append(Result(f"mirror {mirror}", Status.WARN, said[0]))
    ours = tuple(f"{m}: " for m in mirrors) + ("no mirror of",)
    other = [line for line in lines if not line.startswith(ours)]
    if other:
        results.append(Result("mirror probe", Status.WARN, "; ".join(other)))
    if chosen:
        rate = re.search(r"\(([0-9.]+ MB/s)\)", next(r.detail for r in results if r.check == f"mirror {chosen}"))
        detail = f"the roots stage would bootstrap from {chosen}" + (f" at {rate.group(1)}" if rate else "")
        results.append(Result("Debian mirror from CodeBuild", Status.OK, detail))
    else:
        results.append(
            Result(
                "Debian mirror from CodeBuild",
                Status.BLOCKER,
                f"no mirror of debianMirrors passed from CodeBuild in {region}: the roots stage would fail",
                "set -c debianMirrors=<a Debian mirror the builder reaches>,... (docs/first-deploy.md, Mirrors)",
            )
        )
    return results


def probe_mirrors(
    plan: DeployPlan,
    client: Clients,
    *,
    build: ProbeBuild,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    progress: Callable[[str], None] = lambda line: None,
) -> list[Result]:
    iam, codebuild = client("iam"), client("codebuild")
    try:
        role = iam.create_role(
            RoleName=build.name,
            AssumeRolePolicyDocument=json.dumps(_TRUST),
            Description="gguf-serve-preflight --probe-mirrors (no permissions; deleted after the probe)",
        )["Role"]["Arn"]
    except (ClientError, BotoCoreError) as e:
        return [Result("mirror probe", Status.WARN, f"could not start: {e}", f"the probe needs {PERMISSIONS}")]
    run = _Run()
    try:
        results = _build(plan, codebuild, build, role, run, sleep, clock, progress)
    except (ClientError, BotoCoreError) as e:
        results = [Result("mirror probe", Status.WARN, f"could not run: {e}", f"the probe needs {PERMISSIONS}")]
    finally:
        left = _clean_up(iam, codebuild, build.name, run, progress)
    return results + [Result("mirror probe", Status.WARN, f"left behind: {what}", "delete it by hand") for what in left]


@dataclass
class _Run:
    project: bool = False  # the project exists
    build_id: str | None = None
    done: bool = False


def _build(plan, codebuild, build: ProbeBuild, role: str, run: _Run, sleep, clock, progress) -> list[Result]:
    _create_project(codebuild, build, role, sleep)
    run.project = True
    run.build_id = codebuild.start_build(projectName=build.name)["build"]["id"]
    deadline = clock() + 60 * (build.timeout_min + QUEUED_TIMEOUT_MIN + 2)
    while True:
        (state,) = codebuild.batch_get_builds(ids=[run.build_id])["builds"]
        progress(f"probe build {run.build_id}: {state.get('currentPhase', 'QUEUED')}")
        run.done = state.get("buildComplete", False)
        if run.done:
            break
        if clock() > deadline:
            return [Result("mirror probe", Status.WARN, f"build {run.build_id} did not finish in time; stopped")]
        sleep(POLL_S)
    exported = {v["name"]: v.get("value", "") for v in state.get("exportedEnvironmentVariables", [])}
    if state["buildStatus"] != "SUCCEEDED" or VARIABLE not in exported:
        failed = [f"{p['phaseType']}: {c.get('message', '')}" for p in state.get("phases", [])
                  if p.get("phaseStatus") not in (None, "SUCCEEDED") for c in p.get("contexts", [])]  # fmt: skip
        detail = f"build {run.build_id} {state['buildStatus']}: {'; '.join(failed) or 'no phase said why'}"
        return [Result("mirror probe", Status.WARN, detail, "run it again; if it fails the same way, see the build")]
    return verdicts(build.mirrors, base64.b64decode(exported[VARIABLE]).decode(errors="replace"), plan.region)


def _create_project(codebuild, build: ProbeBuild, role: str, sleep: Callable[[float], None]) -> None:
    """CreateProject checks that CodeBuild can assume the role, which a role made seconds ago may not yet allow
    (IAM is eventually consistent): retried for up to a minute."""
    for attempt in range(10):
        try:
            codebuild.create_project(
                name=build.name,
                description="gguf-serve-preflight --probe-mirrors: docker/pick-mirror.sh once per mirror",
                source={"type": "NO_SOURCE", "buildspec": json.dumps(buildspec())},
                artifacts={"type": "NO_ARTIFACTS"},
                environment={
                    "type": "LINUX_CONTAINER",
                    "image": build.image,
                    "computeType": build.compute,
                    "environmentVariables": [
                        {"name": "DEBIAN_MIRRORS", "value": " ".join(build.mirrors), "type": "PLAINTEXT"}
                    ],
                },
                serviceRole=role,
                timeoutInMinutes=build.timeout_min,
                queuedTimeoutInMinutes=QUEUED_TIMEOUT_MIN,
                logsConfig={"cloudWatchLogs": {"status": "DISABLED"}, "s3Logs": {"status": "DISABLED"}},
            )
            return
        except ClientError as e:
            if e.response["Error"]["Code"] != "InvalidInputException" or attempt == 9:
                raise
            sleep(6)


def _clean_up(iam, codebuild, name: str, run: _Run, progress: Callable[[str], None]) -> list[str]:
    """Stop the build if it still runs, delete the project and the role; what could not be deleted is named."""
    steps = [
        (f"build {run.build_id}", lambda: codebuild.stop_build(id=run.build_id), run.build_id and not run.done),
        (f"CodeBuild project {name}", lambda: codebuild.delete_project(name=name), run.project),
        (f"IAM role {name}", lambda: iam.delete_role(RoleName=name), True),
    ]
    left = []
    for what, step, needed in steps:
        if not needed:
            continue
        try:
            step()
        except (ClientError, BotoCoreError) as e:
            left.append(f"{what} ({e})")
            progress(f"left behind by the probe: {what} ({e}); delete it by hand")
    return left
