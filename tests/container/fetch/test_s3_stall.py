"""A cache that answers nothing gives up within its stated bound (s3cache.CacheBounds) and ModelScope serves: the
cache built as the fetcher builds it (its own botocore client, found by AWS_ENDPOINT_URL), against an S3 stand-in
that stays silent where a broken cache would: at the head, or after the head, on every range.

The bounds here are a second each, so the test takes seconds; the committed ones and what they add up to are
checked below, and the log line names the bound the fetch runs under."""

from __future__ import annotations

import hashlib
import http.server
import logging
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_serve.container.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.s3cache import CacheBounds, S3Cache
from gguf_serve.local.hub import LocalScope

REPO, FILE = "owner/stalled-GGUF", "stalled.gguf"
DATA = bytes(range(256)) * 4096  # 1 MiB
SHA = hashlib.sha256(DATA).hexdigest()
QUICK = CacheBounds(connect_s=1.0, read_s=1.0, backoff_cap_s=0.2)


class _Silent(http.server.BaseHTTPRequestHandler):
    """S3 that answers the head (the object is there, its sha256 matches) or not, and never answers a range."""

    protocol_version = "HTTP/1.1"
    head_answers = True
    hold = threading.Event()

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's name
        if not self.head_answers:
            self.hold.wait(60)
            return
        self.send_response(200)
        for name, value in (("Content-Length", str(len(DATA))), ("ETag", '"0a1b"'), ("x-amz-meta-sha256", SHA),
                            ("Content-Type", "application/octet-stream")):  # fmt: skip
            self.send_header(name, value)
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        self.hold.wait(60)  # silence: no status line, no byte

    def log_message(self, *args: object) -> None:
        return


@pytest.fixture
def silent(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Silent]]:
    handler = type("Silent", (_Silent,), {"hold": threading.Event()})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    for name, value in {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{server.server_address[1]}",
                        "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():  # fmt: skip
        monkeypatch.setenv(name, value)
    yield handler
    handler.hold.set()
    server.shutdown()


def _fetch(hub: LocalScope, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> tuple[float, str]:
    (hub.root / REPO).mkdir(parents=True)
    (hub.root / REPO / FILE).write_bytes(DATA)
    cache = S3Cache("s3://model-cache/models", region="cn-northwest-1", connections=2, bounds=QUICK)
    began = time.monotonic()
    with caplog.at_level(logging.INFO, logger="gguf-serve-fetch"):
        result = fetch_file(FileSpec(REPO, FILE, sha256=SHA, size=len(DATA)), tmp_path / "models", endpoint=hub.url,
                            s3_cache=cache, progress=False, upload=False)  # fmt: skip
    assert result.source == "modelscope" and result.path.read_bytes() == DATA
    return time.monotonic() - began, caplog.text


def test_a_cache_silent_at_the_head_gives_up_within_its_bound(silent, hub, tmp_path, caplog):
    silent.head_answers = False
    took, text = _fetch(hub, tmp_path, caplog)
    assert "S3 cache unreachable" in text
    assert took < QUICK.lookup_s + 5, (took, QUICK.lookup_s)  # 5 s for ModelScope's own part on a loaded machine


def test_a_cache_silent_on_every_range_gives_up_within_its_bound(silent, hub, tmp_path, caplog):
    took, text = _fetch(hub, tmp_path, caplog)
    assert f"given up for ModelScope after {QUICK.read_s_total:.0f} s of silence" in text
    assert "fetching from ModelScope instead" in text
    assert took < QUICK.give_up_s + 5, (took, QUICK.give_up_s)


def test_the_committed_bounds_are_seconds_and_tighter_than_modelscopes():
    from gguf_serve.container.fetch.pace import RatePolicy

    bounds = CacheBounds()
    assert bounds.lookup_s == 16 and bounds.read_s_total == 26 and bounds.give_up_s == 42
    assert bounds.rate().idle_s < RatePolicy().idle_s and bounds.rate().min_bps > RatePolicy().min_bps
