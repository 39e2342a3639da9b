"""The whole-app syntheses the fast tier shares: three option sets, each synthesized once per test session with
build_app (the CLI's options, feature flags and cdk-nag plugin) and read by every test that needs a whole template
or assembly. Together the three sets hold every deploy option but EksServingStack's two, which its own synthesis
holds (tests/stacks/eks/conftest.py; test_deploy_options.py checks it); what one option does to one construct is
tested on that construct alone (tests/stacks/constructs/).

pytest-xdist workers share them: the first worker that needs a set synthesizes it into the session's shared
folder under a lock, and the others read that cloud assembly (pytest-xdist's documented way to run a
session-scoped fixture once: a file lock in the folder all workers share).
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from stacks.app import build_app, plan_app
from tests.committed import PROFILES

CERT = "arn:aws-cn:acm:cn-northwest-1:111122223333:certificate/0a1b2c3d-1111-2222-3333-444455556666"
IAM_CERT = "arn:aws-cn:iam::111122223333:server-certificate/llama-internal"  # China's usual kind: ACM issues none
MIRROR_IMAGE = "123456789012.dkr.ecr.cn-northwest-1.amazonaws.com.cn/mirror/qwen36-runtime:trixie"
BUILD_ARGS = f"PIP_INDEX_URL=https://mirrors.aliyun.com/pypi/simple,LLAMA_CPP_BUILD=11312,RUNTIME_IMAGE={MIRROR_IMAGE}"

# name -> the -c values on top of the tests' context, with no deploy.toml (an absent file): each option's default
# unless it is named here.
OPTION_SETS: dict[str, dict[str, str]] = {
    "committed": {},  # deploy.toml as committed (test_deploy_options.py: it keeps every default)
    # A group at zero without a warm pool that wakes on a request; callers limited; the image built natively on
    # Graviton from mirrors.
    "ningxia-from-zero": {
        "minCapacity": "0",
        "wakeOnRequest": "true",
        "warmPool": "0",
        "allowedCidrs": "10.8.0.0/16,192.168.10.0/24",
        "imageBuildArgs": BUILD_ARGS,
        "arm64Builder": "native",
        "debianMirrors": "http://mirrors.ustc.edu.cn/debian,https://mirrors.aliyun.com/debian",
        "allowTypedLock": "true",
    },
    # Beijing, an account named, CPU stacks on Spot, asleep off hours and woken by a request, HTTPS; the SageMaker
    # stacks on every type (the pre-flight found the quotas), scaled on their own busy slots, GPU without an AMI
    # version (the late-refusal fallbacks: docs/first-deploy.md).
    "beijing-cost-saver": {
        "region": "cn-north-1",
        "account": "111122223333",
        "spot": "true",
        "offHours": "20-8",
        "wakeOnRequest": "true",
        "certificateArn": IAM_CERT,
        "sagemakerUnlistedTypes": "true",
        "sagemakerScalingMetric": "slots",
        "sagemakerInferenceAmi": "false",
    },
}


# The committed set is the whole default app (the SageMaker stacks too), and so is Beijing's (its SageMaker options);
# the other set changes the fleet's options only, so it synthesizes the EC2 stacks only.
EC2_ONLY = ("ningxia-from-zero",)


# Relative cost of a set's synthesis (stacks synthesized), for sharing them out among workers.
WEIGHT = {name: 1 if name in EC2_ONLY else 2 for name in OPTION_SETS}


def share(worker: int, workers: int) -> list[str]:
    """The option sets worker number `worker` of `workers` synthesizes first: the heaviest set to the least loaded
    worker, in turn (with 2 workers: the committed set to one, the two others to the other)."""
    load = [0] * workers
    mine: list[str] = []
    for name in sorted(OPTION_SETS, key=lambda n: -WEIGHT[n]):
        least = load.index(min(load))
        load[least] += WEIGHT[name]
        if least == worker:
            mine.append(name)
    return mine


@dataclass(frozen=True)
class Synthesized:
    """One option set's cloud assembly, as `cdk synth` writes it."""

    name: str
    directory: Path

    @property
    def stacks(self) -> list[str]:
        manifest = json.loads((self.directory / "manifest.json").read_text())
        return sorted(k for k, v in manifest["artifacts"].items() if v["type"] == "aws:cloudformation:stack")

    def template_file(self, stack: str) -> Path:
        return self.directory / f"{stack}.template.json"

    def template(self, stack: str) -> dict:
        return json.loads(self.template_file(stack).read_text())

    @property
    def refusals(self) -> dict[str, str]:
        """Stack -> why the CLI refuses to deploy it (the app's plan: a model not locked, a type not hosted)."""
        return json.loads((self.directory / "refusals.json").read_text())

    def metadata(self, stack: str) -> dict[str, list[dict]]:
        """Construct path -> its metadata entries (acknowledged rules, warnings, errors)."""
        return json.loads((self.directory / f"{stack}.metadata.json").read_text())


class WholeApps:
    """OPTION_SETS, synthesized on first use in this session (by this worker or another), then read."""

    def __init__(self, shared: Path, context: Callable[[], dict]) -> None:
        """shared: the folder the workers share; context: the tests' CLI context (tests.conftest.cdk_context)."""
        self._shared = shared
        self._context = context
        self._done: dict[str, Synthesized] = {}

    def __getitem__(self, name: str) -> Synthesized:
        if name not in self._done:
            self._done[name] = self._synthesize(name)
        return self._done[name]

    def _synthesize(self, name: str) -> Synthesized:
        folder = self._shared / f"whole-app-{name}"
        self._shared.mkdir(parents=True, exist_ok=True)
        with open(self._shared / f"whole-app-{name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, also when this worker dies
            if not (folder / ".synthesized").is_file():
                context = {**self._context(), **OPTION_SETS[name]}
                config = self._shared / "absent-deploy.toml"  # no deploy.toml: the defaults, then OPTION_SETS
                stack_names = [p.stack_name for p in PROFILES.values()] if name in EC2_ONLY else None
                plan = plan_app(context, config_file=config, stack_names=stack_names)
                # Every stack built whole, a refused one too (its refusal kept beside the assembly, not annotated:
                # in-process synth fails the whole app on one stack's error, the CLI only the stack selected).
                app = build_app(context, plan=plan, outdir=str(folder), annotate_refusals=False)
                app.synth()  # raises on any cdk-nag finding
                (folder / "refusals.json").write_text(json.dumps(plan.refusals, indent=1, sort_keys=True))
                (folder / ".synthesized").touch()
        return Synthesized(name, folder)


def shared_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder every xdist worker of this session sees (the session's own folder without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
