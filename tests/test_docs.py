"""Every path the README and docs/ name exists, every link resolves (anchors too), and the README stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docker" / "README.md"]
# A repository path: one of the tree's top-level folders, then path characters. Instance paths (/etc, /opt),
# globs and placeholders (<...>, *) are not repository paths.
TOP = ("app.py", "cdk.json", "cdk.context.json", "deploy.toml", "pyproject.toml", "Makefile", ".ci/")
FOLDERS = ("stacks", "userdata", "docker", "gguf_serve", "tests", "profiles", "scripts", "docs")
PATH = re.compile(r"(?<![\w./~$-])((?:" + "|".join(FOLDERS) + r")/[\w./-]*[\w/])")
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"\s", "-", re.sub(r"[^\w\s-]", "", text))


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.+)$", text, re.M)}


def _prose(page: Path) -> str:
    return page.read_text()


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_repository_path_a_page_names_exists(page: Path) -> None:
    missing = sorted({p for p in PATH.findall(_prose(page)) if "*" not in p and not (ROOT / p.rstrip(".")).exists()})
    assert missing == [], f"{page.relative_to(ROOT)} names paths that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_resolves(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page)):
        if target.startswith(("http://", "https://", "mailto:")):
            continue
        file, _, anchor = target.partition("#")
        dest = (page.parent / file).resolve() if file else page
        if not dest.exists() or anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(target)
    assert broken == [], f"{page.relative_to(ROOT)} links to what does not exist: {broken}"


def test_the_readme_is_a_few_screens_and_names_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    assert "make demo" in text and "make test" in text


def test_the_checker_finds_a_missing_path_and_a_broken_anchor(tmp_path: Path) -> None:
    """Negative control: the two checks above fail on a page that has what they forbid."""
    page = tmp_path / "page.md"
    page.write_text("# Title\nSee `gguf_serve/nowhere.py` and [x](#no-such-heading), [y](#title).\n")
    assert PATH.findall(page.read_text()) == ["gguf_serve/nowhere.py"]
    assert "no-such-heading" not in _anchors(page) and "title" in _anchors(page)


def test_the_option_names_and_versions_the_docs_give_are_the_codes() -> None:
    """A `-c name=` anywhere, each row of docs/eks.md's option table, and the cluster's Kubernetes version and kubectl
    layer in docs/eks.md are what the code has (a renamed option and the 1.33 cluster once stayed in the docs)."""
    from stacks.app import MODEL_LOCK_CONTEXT, MODEL_LOOKUP_CONTEXT
    from stacks.eks.cluster import KUBERNETES_MINOR
    from stacks.options import OPTION_NAMES

    known = {*OPTION_NAMES, MODEL_LOCK_CONTEXT, MODEL_LOOKUP_CONTEXT, "key", "name"}  # the last two: placeholders
    for page in PAGES:
        named = set(re.findall(r"-c (\w+)=", page.read_text()))
        assert named <= known, f"{page.relative_to(ROOT)} names options the app does not know: {named - known}"
    eks = (ROOT / "docs" / "eks.md").read_text()
    table = eks.split("| deploy option | on EKS |", 1)[1].split("\n\n", 1)[0]
    rows = {n.split("=")[0] for cell in re.findall(r"^\| ([^|]+) \|", table, re.M) for n in re.findall(r"`(\w+)", cell)}
    assert rows and rows <= set(OPTION_NAMES), rows - set(OPTION_NAMES)
    minor = KUBERNETES_MINOR
    assert f"Kubernetes {minor}" in eks and f"aws-cdk.lambda-layer-kubectl-v{minor.replace('.', '')[1:]}" in eks
    assert set(re.findall(r"(?:Kubernetes|for|valid for) (1\.\d\d)\b", eks)) == {minor}
