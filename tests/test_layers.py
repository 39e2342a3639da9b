"""The import graph of the whole tree, read with the standard library's `ast`: no cycles, and imports run down the
layers of docs/architecture.md only. Every import counts, also one inside a function or under TYPE_CHECKING:
a lazy import is still a dependency, and a circle of them is still a circle."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SKIP = {".git", ".venv", ".venv-checkov", "node_modules", "cdk.out", "__pycache__"}

# docs/architecture.md: a module may import its own layer or a lower one, never a higher one. A module's layer is
# that of the longest entry its dotted name starts with.
LAYERS: dict[str, int] = {
    "gguf_serve": 0,  # the package face: a docstring
    "gguf_serve.container": 0,  # what the image runs: spec, server flags, shared names (standard library only)...
    "gguf_serve.container.fetch": 1,  # ...and the image's tools above them
    "gguf_serve.container.metrics": 1,
    "gguf_serve.container.hop": 1,
    "gguf_serve.container.launch": 1,
    "gguf_serve.container.sagemaker": 1,  # the image as a SageMaker container: the hop, launch and metrics above
    "gguf_serve.container.kube": 1,  # a pod's API key, serve with it, the scaler (they use launch, hop, metrics)
    "gguf_serve.local.hub": 1,  # a local ModelScope-shaped hub (tests, demo, benchmarks)
    "gguf_serve.catalog": 2,  # the data types and their one loader
    "gguf_serve.local": 3,  # the local runner and the demo (they read the catalog)
    "gguf_serve.local.bench": 4,  # builders that read a profile
    "gguf_serve.local.workstation": 4,
    "userdata": 4,
    "stacks": 5,  # constructs and the stacks that compose them
    "gguf_serve.preflight": 6,  # entry points and everything that drives the whole
    "app": 6,
    "scripts": 6,
    "docker": 6,
    "tests": 7,  # tests, the fake-instance harness and the benchmarks
}
# The image copies gguf_serve/container/ (and the package face) and nothing else of the tree.
IMAGE_PACKAGE = "gguf_serve.container"


def _modules() -> dict[str, Path]:
    found = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT)
        if SKIP & set(rel.parts):
            continue
        parts = list(rel.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a non-module attribute: its module
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        component.append(top)
                        if top == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
            elif child not in index:
                index[child] = low[child] = len(index)
                stack.append(child)
                on_stack.add(child)
                work.append((child, iter(sorted(graph[child]))))
            elif child in on_stack:
                low[node] = min(low[node], index[child])
    return found


def _layer(module: str) -> int:
    parts = module.split(".")
    for i in range(len(parts), 0, -1):
        if ".".join(parts[:i]) in LAYERS:
            return LAYERS[".".join(parts[:i])]
    raise AssertionError(f"{parts[0]}/ has no layer: add it to LAYERS here and to docs/architecture.md")


def test_the_import_graph_has_no_cycles():
    assert _cycles(_graph()) == []


def test_imports_run_down_the_layers_only():
    upward = sorted(
        f"{src} (layer {_layer(src)}) imports {dst} (layer {_layer(dst)})"
        for src, targets in _graph().items()
        for dst in targets
        if _layer(dst) > _layer(src)
    )
    assert upward == []


def test_the_image_code_imports_nothing_else_of_the_tree():
    """What the image runs imports only itself, the package face and third-party packages the image installs."""
    leaks = sorted(
        f"{src} imports {dst}"
        for src, targets in _graph().items()
        if src == IMAGE_PACKAGE or src.startswith(IMAGE_PACKAGE + ".")
        for dst in targets
        if dst != "gguf_serve" and dst != IMAGE_PACKAGE and not dst.startswith(IMAGE_PACKAGE + ".")
    )
    assert leaks == []


def test_the_container_modules_import_only_the_standard_library():
    """gguf_serve/container/*.py (spec, flags, names): the runtime spec's loader needs nothing installed."""
    import sys

    for path in sorted((ROOT / "gguf_serve" / "container").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top == "gguf_serve":
                    assert _layer(name) == 0, f"{path.name} imports {name}"
                else:
                    assert top in sys.stdlib_module_names, f"{path.name} imports {top}"


def test_the_checker_sees_a_cycle_and_an_upward_import():
    """Negative control: the two checks above fail on a graph that has what they forbid."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    graph = _graph()
    assert (
        "gguf_serve.container.spec" in graph["gguf_serve.container.launch.cli"]
        and "gguf_serve.catalog.profiles" in graph["gguf_serve.catalog.loader"]
    )
    assert _layer("gguf_serve.container.spec") < _layer("gguf_serve.catalog.loader") < _layer("stacks.app")
