"""The shape issue 22 asks of stacks/, read from the source with the standard library's ast: the stacks compose
(their __init__ at most 60 lines, the only classes that take a whole plan or profile: ServingStack, SageMakerStack
in stacks/sagemaker/, EksServingStack in stacks/eks/ and SharedEndpointStack), each construct builds from narrow
props (no __init__ over 80 lines), and each file holds one idea (at most 350 lines)."""

from __future__ import annotations

import ast
from pathlib import Path

STACKS = Path(__file__).parents[2] / "stacks"
MAX_FILE_LINES = 350
MAX_CONSTRUCT_INIT = 80
MAX_STACK_INIT = 60
STACKS_THAT_COMPOSE = (
    "serving_stack.py:ServingStack",
    "stack.py:SageMakerStack",
    "stack.py:EksServingStack",
    "shared_endpoint.py:SharedEndpointStack",
)


def _files() -> list[Path]:
    return sorted(STACKS.rglob("*.py"))


def _inits() -> list[tuple[str, ast.FunctionDef]]:
    found = []
    for path in _files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                for item in node.body:
                    if isinstance(item, ast.FunctionDef) and item.name == "__init__":
                        found.append((f"{path.name}:{node.name}", item))
    return found


def test_every_stacks_file_holds_one_idea():
    long = {p.name: n for p in _files() if (n := len(p.read_text().splitlines())) > MAX_FILE_LINES}
    assert not long, f"split these files (over {MAX_FILE_LINES} lines): {long}"


def test_constructs_build_in_short_inits_and_the_stack_only_composes():
    inits = _inits()
    assert any(name.endswith(":ServingStack") for name, _ in inits)
    for name, fn in inits:
        limit = MAX_STACK_INIT if name in STACKS_THAT_COMPOSE else MAX_CONSTRUCT_INIT
        lines = fn.end_lineno - fn.lineno + 1
        assert lines <= limit, f"{name}.__init__ is {lines} lines (at most {limit})"


def test_only_the_stack_takes_a_whole_plan_or_profile_or_fleet():
    """A construct takes its own part of the [fleet] table (gguf_serve/catalog/fleet.py), never the whole."""
    takers = []
    whole = ("ServingProfile", "ServicePlan", "FleetSettings", "DeployOptions")
    for name, fn in _inits():
        args = fn.args.args + fn.args.kwonlyargs
        if any(a.annotation is not None and any(w in ast.unparse(a.annotation) for w in whole) for a in args):
            takers.append(name)
    assert sorted(takers) == sorted(STACKS_THAT_COMPOSE), takers
