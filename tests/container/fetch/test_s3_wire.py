"""The S3 cache read over real HTTP (botocore's own connections), from the rehearsal's S3 stand-in for large objects
(tests/rehearsal/objectstore.py): the stand-in the S3 benchmark and the real-size boot measure must be one the
fetcher reads correctly, and an object replaced mid-download must be refused, not mixed."""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import mmap
import os
import random
import socket
import struct
import termios
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from werkzeug.serving import make_server

from gguf_serve.container.fetch import FetchError, FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.container.fetch.s3cache import S3Cache
from tests.container.fetch.conftest import sha256_of
from tests.rehearsal import objectstore
from tests.rehearsal.objectstore import ObjectFiles, serve

BUCKET, KEY = "model-cache", "models/owner/big-GGUF/master/big.gguf"
UNREACHABLE = "http://127.0.0.1:9"


@pytest.fixture(params=["own server", "werkzeug"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[ObjectFiles, str, bytes]]:
    """The S3 benchmark's own server, or werkzeug's as the rehearsal's AWS stand-in runs it (sendfile both)."""
    data = random.Random(7).randbytes(9 * MIB + 5)
    (tmp_path / "object").write_bytes(data)
    files = ObjectFiles(connection_bps=200e6)
    files.put(BUCKET, KEY, tmp_path / "object", {"sha256": hashlib.sha256(data).hexdigest()})
    if request.param == "own server":
        served = serve(files)
        try:
            yield files, served.url, data
        finally:
            served.close()
        return
    server = make_server("127.0.0.1", 0, files, threaded=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield files, f"http://127.0.0.1:{server.server_port}", data
    finally:
        server.shutdown()
        server.server_close()


def _cache(url: str, connections: int = 4) -> S3Cache:
    client = boto3.client("s3", region_name="cn-northwest-1", endpoint_url=url, aws_access_key_id="t",
                          aws_secret_access_key="t")  # noqa: S106  # fmt: skip
    return S3Cache(f"s3://{BUCKET}/models", client=client, connections=connections)


def test_ranged_reads_from_the_stand_in_give_the_verified_file(store, tmp_path: Path) -> None:
    files, url, data = store
    spec = FileSpec("owner/big-GGUF", "big.gguf", sha256=hashlib.sha256(data).hexdigest(), size=len(data))
    r = fetch_file(spec, tmp_path / "out", endpoint=UNREACHABLE, s3_cache=_cache(url), part_size=2 * MIB,
                   upload=False, progress=False)  # fmt: skip
    assert r.source == "s3" and sha256_of(r.path) == spec.sha256
    assert files.counters.heads == 1 and files.counters.gets >= 5 and files.counters.bytes_sent >= len(data)


def test_an_object_replaced_during_the_download_is_refused(store, tmp_path: Path) -> None:
    files, url, data = store
    cache = _cache(url)
    obj = cache.lookup("owner/big-GGUF", "master", "big.gguf")
    assert obj is not None and obj.size == len(data)
    (tmp_path / "object").write_bytes(data[::-1])
    files.put(BUCKET, KEY, tmp_path / "object", {"sha256": "0" * 64})  # a new ETag, as a new upload has
    with pytest.raises(FetchError, match="replaced during the download"):
        next(iter(cache.source(obj).stream(0, MIB)))
    assert files.counters.refused == 1


def _resident_pages(path: Path) -> int:
    """Pages of a file this machine's page cache holds: mincore(2) over a copy-on-write mapping (nothing written)."""
    size, page = path.stat().st_size, mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    vec = ctypes.create_string_buffer((size + page - 1) // page)
    with path.open("rb") as f, mmap.mmap(f.fileno(), size, access=mmap.ACCESS_COPY) as m:
        first = ctypes.c_char.from_buffer(m)
        try:
            if libc.mincore(ctypes.addressof(first), size, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del first  # the mapping closes only once no buffer of it is exported
    return sum(b & 1 for b in vec.raw)


def test_the_stand_in_leaves_next_to_none_of_what_it_sent_in_the_page_cache(tmp_path: Path) -> None:
    """S3's copy is not in an instance's memory: what the stand-in read to send a body must not stay in this
    machine's page cache, where a real-size boot's 16.8 GB evicted the instance's copy of the same bytes. One body
    over real TCP on loopback, read to its end by the peer; then its late drop."""
    source = tmp_path / "object"
    source.write_bytes(random.Random(3).randbytes(40 * MIB + 5))  # past the drop's lag: both drops run
    with source.open("rb+") as f:
        os.fsync(f.fileno())  # dirty pages are never dropped, clean ones are
    size = source.stat().st_size
    body = objectstore.FileBody(source, 0, size, [], lambda **_: None)
    with socket.create_server(("127.0.0.1", 0)) as listener:
        reader = socket.create_connection(listener.getsockname())
        sender, _ = listener.accept()
        with reader, sender:
            got = bytearray()
            pump = threading.Thread(target=lambda: got.extend(_read_all(reader, size)))
            pump.start()
            body.sendfile(sender)
            pump.join(30)
            # The sender's socket holds each page until the peer's ACK for it is processed, after the peer has
            # read it (measured: 2 MiB of 40 still held, in one run on a loaded machine): wait for its queue.
            deadline = time.monotonic() + 10
            while _unacked(sender) and time.monotonic() < deadline:
                time.sleep(0.01)
    assert len(got) == size
    objectstore._drop_late(now=float("inf"))  # the body's second, passed
    left, pages = _resident_pages(source), (size + mmap.PAGESIZE - 1) // mmap.PAGESIZE
    # Dropped as sendfile returned, the pages a socket still held stayed: all 10,241 of them. Now none, but in about
    # one run in ten on a loaded machine one 2 MiB folio and a page (513) stayed, the socket's queue empty; the
    # cause is not established (a large folio across two of the lagged drops' ranges, kept by a reference the
    # drop does not wait for, is a guess). The real-size boot prints what stayed: at most 0.5 GB of 16.8.
    assert left <= pages // 10, f"{left} of {pages} pages of the source still cached"


def _unacked(sock: socket.socket) -> int:
    """Bytes a TCP socket still holds to send or to see acknowledged (SIOCOUTQ)."""
    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


def _read_all(sock: socket.socket, size: int) -> bytes:
    got = bytearray()
    while len(got) < size and (data := sock.recv(1 << 20)):
        got += data
    return bytes(got)
