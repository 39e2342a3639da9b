"""The characters a name from a profile may hold: the ones a hub allows in a repository and its files, so that no
name carries a shell's, a systemd unit's or a URL's syntax into an instance (the boot script quotes them too).

Hub repository ids: letters, digits, '.', '_' and '-' in the owner and in the name, beginning and ending with a
letter or digit (Hugging Face's rule for repo ids, which ModelScope's repo names follow: its web form and SDK publish
no other); a file is such segments joined by '/'. Profile and model names: the same characters, no '/'.
"""

from __future__ import annotations

import re
from collections.abc import Callable

_SEGMENT = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
REPO = re.compile(rf"{_SEGMENT}/{_SEGMENT}")
FILE_SEGMENT = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,254}")
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # a profile (its file's stem) or a model (models.toml)
REVISION = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,127}")
ALLOWED_CHARS = "letters, digits, '.', '_' and '-'"


def hub_repo(text: str) -> bool:
    return bool(REPO.fullmatch(text)) and ".." not in text


def hub_file(text: str) -> bool:
    parts = text.split("/")
    return len(text) <= 1024 and all(FILE_SEGMENT.fullmatch(p) and p not in (".", "..") for p in parts)


def plain_name(text: str) -> bool:
    return bool(NAME.fullmatch(text)) and ".." not in text


HUB_SHAPES: dict[str, tuple[Callable[[str], bool], str]] = {
    "repo": (hub_repo, f"owner/name, each of {ALLOWED_CHARS}, beginning and ending with a letter or digit"),
    "file": (hub_file, f"a path in the repo: names of {ALLOWED_CHARS} joined by '/'"),
    "name": (plain_name, f"{ALLOWED_CHARS}, beginning with a letter or digit, at most 128"),
}
