#!/usr/bin/env python3
"""Unpack the llama.cpp tree vendored in a pinned llama-cpp-python sdist, checked against its sha256.

The sdist is staged into the build context before deploy (scripts/stage-image-sources.sh), so the builder
reaches no package index. Only when it was not staged, and an index URL is given, is it downloaded from that
PEP 503 index (a mirror in China serves exactly PyPI's bytes: the sha256 is pinned). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import html.parser
import shutil
import sys
import tarfile
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

PROJECT = "llama-cpp-python"


class _Links(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            self.hrefs += [v for k, v in attrs if k == "href" and v]


def sdist_url(index_url: str, version: str) -> str:
    page_url = f"{index_url.rstrip('/')}/{PROJECT}/"
    with urllib.request.urlopen(page_url, timeout=60) as r:  # noqa: S310 - an https index URL from a build arg
        parser = _Links()
        parser.feed(r.read().decode("utf-8", errors="replace"))
    name = f"llama_cpp_python-{version}.tar.gz"
    for href in parser.hrefs:
        if urllib.parse.urlsplit(href).path.endswith("/" + name):
            return urllib.parse.urljoin(page_url, href.split("#", 1)[0])
    sys.exit(f"{name} is not on {page_url}")


def download(url: str, dest: Path, sha256: str) -> None:
    digest = hashlib.sha256()
    with urllib.request.urlopen(url, timeout=300) as r, dest.open("wb") as out:  # noqa: S310
        while chunk := r.read(1 << 20):
            digest.update(chunk)
            out.write(chunk)
    if digest.hexdigest() != sha256:
        sys.exit(f"sha256 mismatch for {url}: got {digest.hexdigest()}, pinned {sha256}")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def extract(sdist: Path, into: str) -> None:
    with tarfile.open(sdist) as tar:
        try:
            tar.extractall(into, filter="data")
        except TypeError:  # Python without PEP 706 (e.g. Debian bookworm's 3.11.2): refuse unsafe members ourselves
            for m in tar.getmembers():
                if m.name.startswith("/") or ".." in Path(m.name).parts or not (m.isfile() or m.isdir() or m.issym()):
                    sys.exit(f"unsafe member {m.name!r} in {sdist}")
            tar.extractall(into)  # noqa: S202 - members checked above


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--staged", type=Path, help="directory that may hold the sdist (llama_cpp_python-<v>.tar.gz)")
    p.add_argument("--index-url", default="", help="PEP 503 index to download from when not staged")
    p.add_argument("--version", required=True)
    p.add_argument("--sha256", required=True)
    p.add_argument("--dest", required=True, type=Path, help="directory to receive the llama.cpp tree")
    a = p.parse_args()
    staged = a.staged / f"llama_cpp_python-{a.version}.tar.gz" if a.staged else None
    with tempfile.TemporaryDirectory() as tmp:
        if staged and staged.is_file():
            if (got := sha256_of(staged)) != a.sha256:
                sys.exit(f"sha256 mismatch for staged {staged}: got {got}, pinned {a.sha256}")
            sdist, origin = staged, f"staged {staged.name}"
        elif a.index_url:
            url = sdist_url(a.index_url, a.version)
            sdist, origin = Path(tmp) / "sdist.tar.gz", url
            download(url, sdist, a.sha256)
        else:
            sys.exit(
                f"llama_cpp_python-{a.version}.tar.gz was not staged in {a.staged} and no index URL was given: run "
                "`make image-sources` before `cdk deploy`, or pass --build-arg PIP_INDEX_URL=<a PEP 503 mirror>"
            )
        extract(sdist, tmp)
        root = Path(tmp) / f"llama_cpp_python-{a.version}"
        shutil.copytree(root / "vendor" / "llama.cpp", a.dest, symlinks=True)
        print(f"llama.cpp tree from {PROJECT}=={a.version} ({origin}, sha256 ok) in {a.dest}")


if __name__ == "__main__":
    main()
