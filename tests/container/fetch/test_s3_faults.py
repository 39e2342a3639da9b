"""The S3 cache through a network that resets and stalls (moto's real S3 API over HTTP behind a TCP relay that cuts
ranged answers mid-body): one fault is retried, a cache that keeps failing falls back to ModelScope with one line,
and no urllib3 exception type ever escapes as a traceback (a 20 GB model is about 1,300 ranged GETs)."""

from __future__ import annotations

import hashlib
import logging
import random
import re
import select
import socket
import struct
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import boto3
import pytest
from botocore.config import Config
from moto.moto_server.threaded_moto_server import ThreadedMotoServer

from gguf_serve.container.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.container.fetch.retry import RetryPolicy
from gguf_serve.container.fetch.s3cache import S3Cache
from gguf_serve.local.hub import LocalScope

REGION, REPO, FILE = "cn-northwest-1", "owner/flaky-GGUF", "flaky.gguf"
UNREACHABLE = "http://127.0.0.1:9"


class FaultyRelay:
    """A TCP relay in front of moto. `faults` lists what happens to the next ranged GETs' answers, in order:
    "reset" (a TCP RST after `after` bytes), "stall" (silence after `after` bytes, then a close); then clean."""

    def __init__(self, upstream: tuple[str, int], after: int = 64 * 1024) -> None:  # body bytes before a fault
        self.upstream, self.after = upstream, after
        self.faults: list[str] = []
        self.injected: list[str] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            pending: list[str] = []  # the fault of each request on this connection, answers in the same order
            threading.Thread(target=self._up, args=(client, server, pending), daemon=True).start()
            threading.Thread(target=self._down, args=(client, server, pending), daemon=True).start()

    def _up(self, client: socket.socket, server: socket.socket, pending: list[str]) -> None:
        # Short waits: a socket closed while another thread blocks in recv() on it is only closed (and reset)
        # when that recv() returns.
        try:
            while True:
                if not select.select([client], [], [], 0.05)[0]:
                    continue
                data = client.recv(65536)
                if not data:
                    return
                if data.startswith(b"GET ") and b"\r\nrange:" in data.lower():
                    with self.lock:
                        fault = self.faults.pop(0) if self.faults else ""
                    pending.append(fault)
                server.sendall(data)
        except (OSError, ValueError):  # ValueError: select() on the client the fault closed (its fd is -1 now)
            pass

    def _down(self, client: socket.socket, server: socket.socket, pending: list[str]) -> None:
        """Answers in order; each one's fault (if any) strikes once `after` bytes of its body went out."""
        buffered = b""
        try:
            while True:
                while b"\r\n\r\n" not in buffered:
                    data = server.recv(65536)
                    if not data:
                        return
                    buffered += data
                head, _, body = buffered.partition(b"\r\n\r\n")
                length = int(re.search(rb"(?i)\r\ncontent-length: *(\d+)", head + b"\r\n").group(1))
                fault = pending.pop(0) if pending and head.startswith(b"HTTP/1.1 206") else ""
                client.sendall(head + b"\r\n\r\n")
                sent = 0
                while sent < length:
                    if not body:
                        body = server.recv(65536)
                        if not body:
                            return
                    piece, body = body[: length - sent], body[length - sent :]
                    if fault and sent + len(piece) > self.after:
                        client.sendall(piece[: self.after - sent])
                        self._strike(fault, client, server)
                        return
                    client.sendall(piece)
                    sent += len(piece)
                buffered = body
        except OSError:
            pass

    def _strike(self, fault: str, client: socket.socket, server: socket.socket) -> None:
        self.injected.append(fault)
        if fault == "stall":
            time.sleep(1.5)  # past the reader's timeout
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # with SO_LINGER 0: a reset
        server.close()

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[FaultyRelay, S3Cache, bytes]]:
    for k, v in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(k, v)
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    relay = FaultyRelay(moto.get_host_and_port())
    direct = boto3.client("s3", region_name=REGION, endpoint_url=_url(moto))
    bucket = f"model-cache-{uuid.uuid4().hex[:12]}"  # moto's state lives as long as the process
    direct.create_bucket(Bucket=bucket, CreateBucketConfiguration={"LocationConstraint": REGION})
    data = random.Random(31).randbytes(4 * MIB + 5)
    direct.put_object(Bucket=bucket, Key=f"{REPO}/master/{FILE}", Body=data,
                      Metadata={"sha256": hashlib.sha256(data).hexdigest()})  # fmt: skip
    client = boto3.client("s3", region_name=REGION, endpoint_url=relay.url,
                          config=Config(read_timeout=0.5, retries={"max_attempts": 1}))  # fmt: skip
    yield relay, S3Cache(f"s3://{bucket}", client=client, connections=2), data
    relay.close()
    moto.stop()


def _url(moto: ThreadedMotoServer) -> str:
    host, port = moto.get_host_and_port()
    return f"http://{host}:{port}"


def _spec(data: bytes) -> FileSpec:
    return FileSpec(REPO, FILE, sha256=hashlib.sha256(data).hexdigest(), size=len(data))


QUICK = RetryPolicy(attempts=2, base_s=0.01, cap_s=0.05)


@pytest.mark.parametrize("fault", ["reset", "stall"])
def test_one_reset_or_stall_in_the_cache_is_retried(cache, tmp_path: Path, fault: str) -> None:
    relay, s3, data = cache
    relay.faults = [fault]
    r = fetch_file(_spec(data), tmp_path, endpoint=UNREACHABLE, s3_cache=s3, part_size=MIB, retry=QUICK,
                   progress=False, upload=False)  # fmt: skip
    assert relay.injected == [fault]
    assert r.source == "s3" and r.path.read_bytes() == data


def test_a_cache_that_keeps_failing_falls_back_to_modelscope_in_one_line(
    cache, hub: LocalScope, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    relay, s3, data = cache
    (hub.root / REPO).mkdir(parents=True)
    (hub.root / REPO / FILE).write_bytes(data)
    relay.after = 0  # right after the head: no byte of progress, so the retries run out
    relay.faults = ["reset", "stall"] * 25
    with caplog.at_level(logging.WARNING, logger="gguf-serve-fetch"):
        r = fetch_file(_spec(data), tmp_path, endpoint=hub.url, s3_cache=s3, part_size=MIB, retry=QUICK,
                       progress=False, upload=False)  # fmt: skip
    assert r.source == "modelscope" and r.path.read_bytes() == data
    fallback = [rec.getMessage() for rec in caplog.records if "ModelScope instead" in rec.getMessage()]
    assert len(fallback) == 1 and "\n" not in fallback[0] and "Traceback" not in caplog.text
    assert "ProtocolError" in fallback[0] or "ReadTimeoutError" in fallback[0], fallback  # the cause, named
