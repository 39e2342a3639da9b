"""`python -m stacks.deployable [-c KEY=VALUE ...]`: which stacks `cdk deploy` would take now, and why each other
one is refused, from the plan `cdk synth` builds with the same context (cdk.json, cdk.context.json, deploy.toml,
then -c) and the same model lookups (a model is locked on the first synth that reaches ModelScope).

Each deployable stack's name on stdout, one a line; each refused one on stderr as `refused: <Stack>: <why>`, one a
line. Exit 0 whatever is refused (`make synth` synthesizes the deployable ones); 1 on bad input, with one line.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gguf_serve.errors import InputError
from stacks.app import build_app, cli_context, plan_app
from stacks.options import DEPLOY_CONFIG


def deployable(context: dict, config_file: Path = DEPLOY_CONFIG) -> tuple[list[str], dict[str, str]]:
    """(every stack the app builds that the CLI would deploy, in the app's order; stack -> why for the others)."""
    plan = plan_app(context, config_file=config_file)
    app = build_app(context, config_file=config_file, plan=plan, annotate_refusals=False)  # SageMaker, EKS join
    names = [child.node.id for child in app.node.children if child.node.id != "Tree"]
    return [n for n in names if n not in plan.refusals], dict(plan.refusals)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stacks.deployable", description=__doc__)
    parser.add_argument("-c", "--context", action="append", default=[], metavar="KEY=VALUE", help="as cdk -c")
    args = parser.parse_args(argv)
    context = cli_context()
    for pair in args.context:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            parser.error(f"-c takes KEY=VALUE, got {pair!r}")
        context[key] = value
    try:
        ok, refused = deployable(context)
    except InputError as bad:
        print(f"error: {bad}", file=sys.stderr)
        return 1
    for why in refused.values():
        print(f"refused: {why}", file=sys.stderr)
    print("\n".join(ok))
    return 0


if __name__ == "__main__":
    sys.exit(main())
