"""The S3 cache read over real HTTP (botocore's own connections), from the rehearsal's S3 stand-in for large objects
(tests/rehearsal/objectstore.py): the stand-in the S3 benchmark and the real-size boot measure must be one the
fetcher reads correctly, and an object replaced mid-download must be refused, not mixed."""

from __future__ import annotations

import hashlib
import random
import threading
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from werkzeug.serving import make_server

from gguf_serve.container.fetch import FetchError, FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.container.fetch.s3cache import S3Cache
from tests.container.fetch.conftest import sha256_of
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


def _cache(url: str) -> S3Cache:
    client = boto3.client("s3", region_name="cn-northwest-1", endpoint_url=url, aws_access_key_id="t",
                          aws_secret_access_key="t")  # noqa: S106  # fmt: skip
    return S3Cache(f"s3://{BUCKET}/models", client=client, connections=4)


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
