"""The lock step: a ModelScope repo + file -> pinned facts, without downloading the file.

Size, sha256 and the file's commit come from ModelScope's file listing (the fetcher's `modelscope` module,
with its trust checks); the GGUF header is read through HTTP Range requests in 1 MiB blocks (its `gguf` module,
with its limits), skipping over long arrays it does not need, and never past `max_header_bytes`. Every failure is one
ProfileError line; HubUnreachable when the network, not the file, is at fault (synth tells the two apart).
Nothing is written here: gguf_serve.catalog.lockfile.commit_entry validates the whole entry first.
"""

from __future__ import annotations

import datetime
import io
import struct
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from gguf_serve.catalog import lockfile, model_facts
from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.lockfile import LockedModel

BLOCK = 1024 * 1024
MAX_HEADER_BYTES = 64 * 1024 * 1024  # a Qwen3.6 header (250k-token vocabulary and merges) is about 10 MB
MAX_TENSORS = 100_000  # a 35B MoE file has about 800; ggml's own limits: 4 dimensions, 64-byte names
MAX_DIMS, MAX_NAME = 4, 64
# A lock reads kilobytes of listing and megabytes of header: a hub that cannot give them in this long is down for
# the purpose (a trickle used to hold `gguf-serve-catalog lock` for minutes: 8 retries of a 30 s rate window).
LOCK_DEADLINE_S = 120.0
LOCK_RATE_WINDOW_S = 10.0
LOCK_RETRIES = 2


class HubUnreachable(ProfileError):
    """The hub could not be read (refused, unresolvable, timed out, trickling, 5xx): the network, not the file."""


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

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

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


def lock_model(
    name: str,
    *,
    repo: str,
    file: str,
    revision: str = "master",
    endpoint: str | None = None,
    retry: Any = None,
    rate: Any = None,
    deadline_s: float = LOCK_DEADLINE_S,
) -> LockResult:
    """Pinned facts for one file of a ModelScope repo: listing (size, sha256, commit) + ranged GGUF header + the
    file's last byte (a listing that overstates the file is not locked).

    retry and rate: modelfetch's RetryPolicy and RatePolicy (synth passes a short retry: a hub that is down
    should cost seconds, not the minutes a download may wait); deadline_s bounds the whole lock."""
    from gguf_serve.container.fetch.errors import FetchError, SizeMismatch, TransientError
    from gguf_serve.container.fetch.gguf import GGUFError, read_metadata_from
    from gguf_serve.container.fetch.modelscope import ModelScope
    from gguf_serve.container.fetch.pace import RatePolicy
    from gguf_serve.container.fetch.retry import RetryPolicy

    retry = retry or RetryPolicy(attempts=LOCK_RETRIES, cap_s=5.0)
    rate = rate or RatePolicy(window_s=LOCK_RATE_WINDOW_S, idle_s=LOCK_RATE_WINDOW_S, headers_s=LOCK_RATE_WINDOW_S)
    try:
        client = ModelScope(endpoint, connections=1, retry=retry, rate=rate, deadline_s=deadline_s)
    except FetchError as e:
        raise ProfileError(f"cannot lock {name}: {e}") from None
    served = _ServedBy(client.pool, client.host)
    client.pool = served
    try:
        listed = client.describe(repo, revision, file)
        if not listed.sha256:
            raise ProfileError(
                f"ModelScope's listing of {repo}@{revision} gives no sha256 for {file}: nothing to pin it to"
            )
        if listed.size > lockfile.MAX_MODEL_BYTES:
            raise ProfileError(
                f"cannot lock {name}: {client.host} lists {file} at {listed.size:,} bytes, more than any volume "
                f"the catalog can plan ({lockfile.MAX_VOLUME_GIB:,} GiB, gp3's limit); not a file this fleet can serve"
            )
        remote = RangedFile(client.source(repo, revision, file, listed.size), listed.size)
        header = io.BufferedReader(remote, 64 * 1024)  # many small reads: 5.2 s -> 1.7 s for 600,000 keys
        meta = read_metadata_from(header, size=listed.size, max_array=1024, label=f"{repo}/{file}")
        tensors = read_tensor_infos(header, meta["GGUF.tensor_count"], label=f"{repo}/{file}")
        facts = model_facts.header_facts(meta)
        # The listing's size is what every instance plans its disk by and checks: the file must end there.
        last = b"".join(client.source(repo, revision, file, listed.size).stream(listed.size - 1, listed.size))
        if len(last) != 1:
            raise SizeMismatch(f"{repo}/{file}: no byte at {listed.size - 1:,}")
    except SizeMismatch as e:
        raise ProfileError(
            f"cannot lock {name}: {client.host} lists {file} at {listed.size:,} bytes but the file does not end "
            f"there ({e}); a listing that disagrees with its file is not locked: try again later"
        ) from None
    except (
        TransientError
    ) as e:  # a FetchError is permanent; this one is the network's (gguf_serve.container.fetch.errors)
        raise HubUnreachable(f"cannot lock {name}: ModelScope at {client.endpoint} is unreachable ({e})") from None
    except (FetchError, GGUFError) as e:
        if isinstance(e.__cause__, TransientError):  # the listing's retries ran out: still the network
            raise HubUnreachable(f"cannot lock {name}: ModelScope at {client.endpoint} is unreachable ({e})") from None
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
        header=facts,
        tensors=tensor_facts(tensors, facts),
        commit=listed.commit,
        endpoint=client.endpoint,
        served_by=served.byte_host or client.host,
        header_bytes_read=remote.bytes_read,
        locked_at=datetime.datetime.now(datetime.UTC).date().isoformat(),
    )
    return LockResult(entry, remote.bytes_read, remote.requests)


class _ServedBy:
    """The client's pool, noting the host that answered each ranged read (the hub redirects to storage)."""

    def __init__(self, pool: Any, hub: str) -> None:
        self.pool, self.hub, self.byte_host = pool, hub, ""

    def request(self, method: str, url: str, *args: Any, **kwargs: Any) -> Any:
        r = self.pool.request(method, url, *args, **kwargs)
        if "Range" in (kwargs.get("headers") or {}):
            history = getattr(getattr(r, "retries", None), "history", ()) or ()
            final = next((h.redirect_location for h in reversed(history) if h.redirect_location), url)
            self.byte_host = urlsplit(final).netloc or self.hub  # a relative Location stays on the hub
        return r

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)


def read_tensor_infos(f: Any, count: int, *, label: str = "GGUF") -> list[tuple[str, int]]:
    """(name, bytes) of every tensor, from the tensor info table that follows the key/value section.

    Each entry: name (u64 length + bytes), n_dims (u32), n_dims x u64 dimensions, ggml type (u32), offset (u64)
    (ggml/src/gguf.cpp). Bytes are ggml's: elements / block size x type size (gguf.GGML_QUANT_SIZES).
    """
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    from gguf_serve.container.fetch.gguf import GGUFError

    pos = f.tell()
    f.seek(0)
    first = f.read(8)
    f.seek(pos)
    endian = ">" if len(first) == 8 and struct.unpack("<I", first[4:])[0] & 0xFFFF == 0 else "<"

    def unpack(fmt: str) -> Any:
        fmt = endian + fmt
        data = f.read(struct.calcsize(fmt))
        if len(data) != struct.calcsize(fmt):
            raise GGUFError(f"{label}: truncated tensor info table")
        return struct.unpack(fmt, data)

    if count > MAX_TENSORS:
        raise GGUFError(f"{label}: implausible tensor count {count:,}")
    out = []
    for _ in range(count):
        (n,) = unpack("Q")
        if n > MAX_NAME * 4:
            raise GGUFError(f"{label}: implausible tensor name length {n}")
        name = f.read(n).decode("utf-8", errors="replace")
        (dims,) = unpack("I")
        if not 1 <= dims <= MAX_DIMS:
            raise GGUFError(f"{label}: tensor {name!r} has {dims} dimensions")
        shape = unpack(f"{dims}Q")
        ggml_type, _offset = unpack("IQ")
        try:
            block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            raise GGUFError(f"{label}: tensor {name!r} has unknown ggml type {ggml_type}") from None
        elements = 1
        for d in shape:
            elements *= d
        out.append((name, elements // block * type_size))
    return out


def tensor_facts(tensors: list[tuple[str, int]], facts: dict[str, Any]) -> dict[str, Any]:
    """What the lock keeps of the tensor table: the count and, for MoE files, expert bytes per block."""
    out: dict[str, Any] = {"count": len(tensors)}
    blocks = facts.get("block_count")
    expert_bytes = model_facts.expert_bytes_from_tensors(tensors, blocks) if isinstance(blocks, int) else []
    if expert_bytes:
        out["expert_bytes"] = expert_bytes
    return out
