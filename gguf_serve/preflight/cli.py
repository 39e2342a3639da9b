"""`gguf-serve-preflight [Stack ...]`: one table (check, result, what to do); exit 1 on a blocker, 2 on bad input."""

from __future__ import annotations

import argparse
import sys

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.errors import InputError
from gguf_serve.preflight.checks import Result, Status, run_checks
from gguf_serve.preflight.plan import deploy_plan


def main(argv: list[str] | None = None, *, session=None) -> int:
    parser = argparse.ArgumentParser(prog="gguf-serve-preflight", description=__doc__)
    parser.add_argument("stacks", nargs="*", help="stacks to check (default: all)")
    parser.add_argument("--profile", help="AWS CLI profile (read-only access is enough)")
    parser.add_argument(
        "-c", "--context", action="append", default=[], metavar="KEY=VALUE",
        help="a deploy option for this run, as `cdk deploy -c` takes it (e.g. spot=true); repeatable",
    )  # fmt: skip
    args = parser.parse_args(argv)
    context = {}
    for pair in args.context:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parser.error(f"-c takes KEY=VALUE, got {pair!r}")
        context[key] = value
    try:
        plan = deploy_plan(args.stacks or None, context=context)
    except InputError as bad:
        print(f"error: {bad}", file=sys.stderr)
        return 2
    if session is None:
        import boto3

        session = boto3.Session(profile_name=args.profile, region_name=plan.region)
    try:
        account = session.client("sts", region_name=plan.region).get_caller_identity()["Account"]
    except (BotoCoreError, ClientError) as e:
        print(f"error: cannot reach the account ({e}); configure credentials for {plan.region}", file=sys.stderr)
        return 2
    stacks = ", ".join(s.stack_name for s in plan.stacks)
    print(f"Pre-flight for {stacks} in account {account}, {plan.region} (read-only)\n")
    results = run_checks(plan, lambda service: session.client(service, region_name=plan.region))
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
