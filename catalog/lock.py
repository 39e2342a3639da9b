"""The lock step: a ModelScope repo + file -> pinned facts, without downloading the file.

Size, sha256 and the file's commit come from ModelScope's file listing (modelfetch.modelscope, with its
trust checks); the GGUF header is read through HTTP Range requests in 1 MiB blocks (modelfetch.gguf, with its
limits), skipping over long arrays it does not need, and never past `max_header_bytes`.
"""

from __future__ import annotations

import datetime
import io
from dataclasses import dataclass
from typing import Any

from catalog import model_facts
from catalog.errors import ProfileError
from catalog.lockfile import LockedModel

BLOCK = 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024 * 1024  # a Qwen3.6 header (250k-token vocabulary and merges) is about 10 MB


class RangedFile(io.RawIOBase):
    """A read-only, seekable view of a remote file that fetches only the blocks it is asked for."""

    def __init__(self, source: Any, size: int, *, block: int = BLOCK, budget: int = MAX_HEADER_BYTES) -> None:
        self.source, self.size, self.block, self.budget = source, size, block, budget
        self.pos = 0
        self.blocks: dict[int, bytes] = {}
        self.bytes_read = 0
        self.requests = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def read(self, n: int = -1) -> bytes:
        end = self.size if n is None or n < 0 else min(self.size, self.pos + n)
        if end <= self.pos:
            return b""
        first, last = self.pos // self.block, (end - 1) // self.block
        self._fetch([i for i in range(first, last + 1) if i not in self.blocks])
        data = b"".join(self.blocks[i] for i in range(first, last + 1))
        out = data[self.pos - first * self.block : end - first * self.block]
        self.pos = end
        return out

    def _fetch(self, missing: list[int]) -> None:
        if not missing:
            return
        start, stop = missing[0] * self.block, min(self.size, (missing[-1] + 1) * self.block)
        if self.bytes_read + (stop - start) > self.budget:
            raise ProfileError(
                f"the GGUF header needs more than {self.budget // (1024 * 1024)} MiB: not a model header this "
                "lock step reads (or a hostile server)"
            )
        data = b"".join(self.source.stream(start, stop))  # one Range request for the contiguous run
        self.requests += 1
        self.bytes_read += len(data)
        for i in missing:
            self.blocks[i] = data[(i - missing[0]) * self.block : (i - missing[0] + 1) * self.block]


@dataclass(frozen=True)
class LockResult:
    entry: LockedModel
    bytes_read: int
    requests: int


def lock_model(name: str, *, repo: str, file: str, revision: str = "master", endpoint: str | None = None) -> LockResult:
    """Pinned facts for one file of a ModelScope repo: listing (size, sha256, commit) + ranged GGUF header."""
    from modelfetch.errors import FetchError
    from modelfetch.gguf import GGUFError, read_metadata_from
    from modelfetch.modelscope import ModelScope

    client = ModelScope(endpoint, connections=1)
    try:
        listed = client.describe(repo, revision, file)
        if not listed.sha256:
            raise ProfileError(
                f"ModelScope's listing of {repo}@{revision} gives no sha256 for {file}: nothing to pin it to"
            )
        remote = RangedFile(client.source(repo, revision, file, listed.size), listed.size)
        meta = read_metadata_from(remote, size=listed.size, max_array=1024, label=f"{repo}/{file}")
    except (FetchError, GGUFError) as e:
        raise ProfileError(f"cannot lock {name}: {e}") from None
    finally:
        client.pool.clear()
    entry = LockedModel(
        name=name,
        repo=repo,
        file=file,
        revision=revision,
        locked_from="listing",
        size_bytes=listed.size,
        sha256=listed.sha256,
        header=model_facts.header_facts(meta),
        commit=listed.commit,
        endpoint=client.endpoint,
        header_bytes_read=remote.bytes_read,
        locked_at=datetime.datetime.now(datetime.UTC).date().isoformat(),
    )
    return LockResult(entry, remote.bytes_read, remote.requests)
