"""The in-region S3 cache (moto): write-back after a ModelScope download, read-first, stale and bad objects."""

from __future__ import annotations

import hashlib
import random
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.fetch import FetchError, FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.container.fetch.s3cache import S3Cache
from gguf_serve.local.hub import LocalScope
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import sha256_of

BUCKET = "model-cache"
REGION = "cn-northwest-1"
UNREACHABLE = "http://127.0.0.1:9"  # discard port: nothing listens, so any ModelScope call fails


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        "AWS_DEFAULT_REGION": REGION,
    }.items():
        monkeypatch.setenv(k, v)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        client = boto3.client("s3", region_name=REGION)
        client.create_bucket(Bucket=BUCKET, CreateBucketConfiguration={"LocationConstraint": REGION})
        yield client


def test_write_back_then_read_in_region(s3, hub: LocalScope, tmp_path: Path) -> None:
    data = random.Random(5).randbytes(20 * MIB + 17)
    (hub.root / "owner/big-GGUF").mkdir(parents=True)
    (hub.root / "owner/big-GGUF/big.gguf").write_bytes(data)
    sha = hashlib.sha256(data).hexdigest()
    spec = FileSpec("owner/big-GGUF", "big.gguf", sha256=sha, size=len(data))
    cache = S3Cache(f"s3://{BUCKET}/models", multipart_chunk=8 * MIB)
    first = fetch_file(spec, tmp_path / "a", endpoint=hub.url, s3_cache=cache, part_size=4 * MIB, progress=False)
    key = "models/owner/big-GGUF/master/big.gguf"
    assert first.source == "modelscope" and first.cached_to == f"s3://{BUCKET}/{key}"
    head = s3.head_object(Bucket=BUCKET, Key=key)
    assert head["ContentLength"] == len(data) and head["Metadata"]["sha256"] == sha
    assert head["ETag"].strip('"').endswith("-3")  # multipart: 20 MiB in 8 MiB parts

    # The next instance reads the cache in parallel ranges and never talks to ModelScope.
    hub.stats.reset()
    second = fetch_file(spec, tmp_path / "b", endpoint=UNREACHABLE, s3_cache=f"s3://{BUCKET}/models",
                        part_size=4 * MIB, progress=False)  # fmt: skip
    assert second.source == "s3" and second.transferred == len(data) and second.cached_to is None
    assert sha256_of(second.path) == sha and hub.stats.requests == []


def test_stale_cache_object_is_ignored_and_replaced(s3, hub: LocalScope, small_file: tuple[Path, str],
                                                    tmp_path: Path) -> None:  # fmt: skip
    _, sha = small_file
    key = f"{SMALL_REPO}/master/{SMALL_FILE}"
    old = random.Random(1).randbytes(1000)
    s3.put_object(Bucket=BUCKET, Key=key, Body=old, Metadata={"sha256": hashlib.sha256(old).hexdigest()})
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE, sha256=sha), tmp_path, endpoint=hub.url,
                   s3_cache=S3Cache(f"s3://{BUCKET}", client=s3), progress=False)  # fmt: skip
    assert r.source == "modelscope" and sha256_of(r.path) == sha
    assert s3.head_object(Bucket=BUCKET, Key=key)["Metadata"]["sha256"] == sha


def test_corrupt_cache_object_falls_back_to_modelscope(s3, hub: LocalScope, small_file: tuple[Path, str],
                                                       tmp_path: Path) -> None:  # fmt: skip
    path, sha = small_file
    key = f"{SMALL_REPO}/master/{SMALL_FILE}"
    bad = bytearray(path.read_bytes())
    bad[77] ^= 1
    s3.put_object(Bucket=BUCKET, Key=key, Body=bytes(bad), Metadata={"sha256": sha})  # lies about its content
    gets = []

    class Counting:
        def __getattr__(self, name: str):
            return getattr(s3, name)

        def get_object(self, **kw):
            gets.append(kw["Range"])
            return s3.get_object(**kw)

    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE, sha256=sha), tmp_path, endpoint=hub.url,
                   s3_cache=S3Cache(f"s3://{BUCKET}", client=Counting()), part_size=MIB, progress=False)  # fmt: skip
    assert r.source == "modelscope" and sha256_of(r.path) == sha
    assert len(gets) == 6  # the bad cache copy was read once (6 parts), not downloaded a second time
    body = s3.get_object(Bucket=BUCKET, Key=key)["Body"].read()
    assert hashlib.sha256(body).hexdigest() == sha  # the cache was repaired


def test_unreadable_cache_is_not_fatal(s3, hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    r = fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, s3_cache="s3://no-such-bucket/x",
                   progress=False)  # fmt: skip
    assert r.source == "modelscope" and r.cached_to is None and sha256_of(r.path) == small_file[1]


def test_malformed_cache_uri_is_a_usage_error(hub: LocalScope, small_file: tuple[Path, str], tmp_path: Path) -> None:
    with pytest.raises(FetchError, match="s3://bucket/prefix"):
        fetch_file(FileSpec(SMALL_REPO, SMALL_FILE), tmp_path, endpoint=hub.url, s3_cache="https://bucket/models",
                   progress=False)  # fmt: skip
    assert hub.stats.requests == []
