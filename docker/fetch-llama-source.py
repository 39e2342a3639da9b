#!/usr/bin/env python3
"""Fetch the llama.cpp tree vendored in a pinned llama-cpp-python sdist from any PEP 503 package index.

Standard library only (it runs in the image's build stage). The sdist's sha256 is pinned, so a mirror in
China (for example https://mirrors.aliyun.com/pypi/simple) serves exactly the bytes PyPI does.
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


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--index-url", required=True)
    p.add_argument("--version", required=True)
    p.add_argument("--sha256", required=True)
    p.add_argument("--dest", required=True, type=Path, help="directory to receive the llama.cpp tree")
    a = p.parse_args()
    url = sdist_url(a.index_url, a.version)
    with tempfile.TemporaryDirectory() as tmp:
        sdist = Path(tmp) / "sdist.tar.gz"
        download(url, sdist, a.sha256)
        with tarfile.open(sdist) as tar:
            tar.extractall(tmp, filter="data")
        root = Path(tmp) / f"llama_cpp_python-{a.version}"
        shutil.copytree(root / "vendor" / "llama.cpp", a.dest, symlinks=True)
        print(f"llama.cpp tree from {PROJECT}=={a.version} ({url}, sha256 ok) in {a.dest}")


if __name__ == "__main__":
    main()
