"""`gguf-serve-preflight [Stack ...] [--probe-mirrors]`: one table (check, result, what to do); exit 1 on a blocker,
2 on bad input. Every check reads only; --probe-mirrors also runs the build's mirror probe in CodeBuild (it creates
and deletes a project and a role, and costs a few build minutes: gguf_serve/preflight/mirror_probe.py)."""

from __future__ import annotations

import argparse
import sys

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.errors import InputError
from gguf_serve.preflight.checks import Result, Status, run_checks
from gguf_serve.preflight.eks import eks_plan_from, run_eks_checks
from gguf_serve.preflight.mirror_probe import ProbeBuild, probe_mirrors
from gguf_serve.preflight.plan import deploy_plan
from gguf_serve.preflight.sagemaker import endpoint_checks
from stacks.eks.stack import STACK_NAME as EKS_STACK


def main(argv: list[str] | None = None, *, session=None) -> int:
    parser = argparse.ArgumentParser(prog="gguf-serve-preflight", description=__doc__)
    parser.add_argument("stacks", nargs="*", help="stacks to check (default: all)")
    parser.add_argument("--profile", help="AWS CLI profile (read-only access is enough but for --probe-mirrors)")
    parser.add_argument(
        "-c", "--context", action="append", default=[], metavar="KEY=VALUE",
        help="a deploy option for this run, as `cdk deploy -c` takes it (e.g. spot=true); repeatable",
    )  # fmt: skip
    parser.add_argument(
        "--probe-mirrors", action="store_true",
        help="also run docker/pick-mirror.sh in a CodeBuild build against each of debianMirrors (NOT read-only: "
        "creates and deletes a CodeBuild project and an IAM role without permissions; a few build minutes)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    context = {}
    for pair in args.context:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parser.error(f"-c takes KEY=VALUE, got {pair!r}")
        context[key] = value
    eks = EKS_STACK in args.stacks
    try:
        plan = deploy_plan(args.stacks or None, context=context)  # EksServingStack's template too, when named
        cluster = eks_plan_from(context) if eks else None  # its node groups, version and AMIs
    except InputError as bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    region = plan.region
    if session is None:
        import boto3

        session = boto3.Session(profile_name=args.profile, region_name=region)
    try:
        account = session.client("sts", region_name=region).get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as e:
        print(f"error: cannot reach the account ({e}); configure credentials for {region}", file=sys.stderr)
        return 2
    probe = ProbeBuild.for_plan(plan) if args.probe_mirrors else None
    if args.probe_mirrors and probe is None:
        print("error: --probe-mirrors: no selected stack builds an x86 image; select one that does", file=sys.stderr)
        return 2
    stacks = ", ".join(s.stack_name for s in plan.planned())
    mode = "read-only checks, then the mirror probe" if probe else "read-only"
    print(f"Pre-flight for {stacks} in account {account}, {region} ({mode})")
    if probe:
        print(probe.describe())
    print()

    def client(service: str):
        return session.client(service, region_name=region)

    results = run_checks(plan, client)
    results += endpoint_checks(plan.endpoints, region, client)
    results += run_eks_checks(cluster, client) if cluster else []
    if probe:
        results += probe_mirrors(plan, client, build=probe, progress=lambda line: print(line, file=sys.stderr))
    print(render(results))
    blockers = sum(r.status is Status.BLOCKER for r in results)
    print(f"\n{blockers} blocker(s), {sum(r.status is Status.WARN for r in results)} warning(s)")
    return 1 if blockers else 0


def render(results: list[Result]) -> str:
    rows = [("check", "result", "detail", "what to do")] + [
        (r.check, r.status.value, r.detail, r.todo) for r in results
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row[:3], widths, strict=True)) + ("  " + row[3] if row[3] else "")
        for row in rows
    ).rstrip()
