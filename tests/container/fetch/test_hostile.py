"""Hostile servers and hostile destinations: `gguf-serve-fetch` ends with one readable line, in bounded time,
and never writes outside --dest or through a planted link."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gguf_serve.local.hub import LocalScope
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import sha256_of
from tests.container.fetch.test_trust import fetch_cli

TRICKLE_WINDOW_S = 1.0  # the rate window and header deadline: each trickle test waits it out twice (1 retry)


def test_a_trickling_server_fails_with_the_host_and_rate(hub: LocalScope, small_file, tmp_path: Path) -> None:
    """One byte every 0.2 s never trips a read timeout; the minimum rate does, and names host and rate."""
    hub.faults.trickle_every_s = 0.2
    started = time.monotonic()
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(tmp_path), "--endpoint", hub.url,
                  "--retries", "1", "--rate-window", str(TRICKLE_WINDOW_S), "--connections", "2",
                  "--part-size-mib", "4", timeout=60)  # fmt: skip
    elapsed = time.monotonic() - started
    assert p.returncode == 1, p.stderr
    host = hub.url.removeprefix("http://")
    assert f"{host} sent" in p.stderr and "B/s" in p.stderr and "below the minimum 65,536 B/s" in p.stderr
    assert "Traceback" not in p.stderr
    print(f"trickle: refused after {elapsed:.1f} s with a {TRICKLE_WINDOW_S} s window and 1 retry")


def test_a_trickling_listing_fails_with_the_host_and_rate(hub: LocalScope, small_file, tmp_path: Path) -> None:
    hub.faults.trickle_json_every_s = 0.2
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(tmp_path), "--endpoint", hub.url,
                  "--retries", "1", "--rate-window", str(TRICKLE_WINDOW_S), timeout=60)  # fmt: skip
    assert p.returncode == 1 and "ModelScope listing" in p.stderr, p.stderr
    assert f"{hub.url.removeprefix('http://')} sent" in p.stderr and "below the minimum 65,536 B/s" in p.stderr


def test_an_overstated_listing_size_leaves_no_reserved_partial(hub: LocalScope, small_file, tmp_path: Path) -> None:
    hub.faults.listed_sizes = {SMALL_FILE: 3 << 30}  # 3 GiB claimed for a 5 MiB file
    dest = tmp_path / "models"
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(dest), "--endpoint", hub.url)
    assert p.returncode == 1 and ("Content-Range" in p.stderr or "smaller than listed" in p.stderr), p.stderr
    assert sorted(q.name for q in dest.iterdir()) == [f".{SMALL_FILE}.lock"]


def test_file_dot_writes_nothing_beside_dest(hub: LocalScope, small_file, tmp_path: Path) -> None:
    base = tmp_path / "disk"
    base.mkdir()
    for bad in (".", "..", "a/../b.gguf", "dir/"):
        p = fetch_cli("--repo", SMALL_REPO, "--file", bad, "--dest", str(base / "models"), "--endpoint", hub.url)
        assert p.returncode == 2 and "path inside the repo" in p.stderr, (bad, p.stderr)
    assert sorted(q.name for q in base.iterdir()) == []


@pytest.mark.parametrize("planted", [f".{SMALL_FILE}.verified", f"{SMALL_FILE}.partial.state.tmp"])
def test_a_planted_symlink_is_not_written_through(planted: str, hub: LocalScope, small_file,
                                                  tmp_path: Path) -> None:  # fmt: skip
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / planted).symlink_to(victim)
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(dest), "--endpoint", hub.url)
    assert victim.read_text() == "precious\n"
    assert "Traceback" not in p.stderr
    if p.returncode == 0:
        assert sha256_of(dest / SMALL_FILE) == small_file[1]
    else:
        assert p.returncode == 1 and len(p.stderr.strip().splitlines()) <= 3, p.stderr


def test_a_symlinked_model_name_is_refused(hub: LocalScope, small_file, tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    dest = tmp_path / "models"
    dest.mkdir()
    (dest / SMALL_FILE).symlink_to(victim)
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(dest), "--endpoint", hub.url)
    assert p.returncode == 1 and "is a symlink" in p.stderr and "Traceback" not in p.stderr
    assert victim.read_text() == "precious\n"


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_an_unusable_dest_is_one_line(kind: str, hub: LocalScope, small_file, tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    if kind == "file":
        dest.write_text("not a folder")
    else:
        dest = Path("/proc/1/models")  # a read-only filesystem even for root
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(dest), "--endpoint", hub.url)
    assert p.returncode == 1 and "Traceback" not in p.stderr
    assert "--dest" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr


def test_signed_redirect_urls_are_not_logged(hub: LocalScope, small_file, tmp_path: Path) -> None:
    hub.faults.redirect_to = hub.url.replace("127.0.0.1", "localhost")
    p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(tmp_path), "--endpoint", hub.url)
    assert p.returncode == 0, p.stderr
    assert any(r["kind"] == "redirect" for r in hub.stats.requests)
    assert "sig=" not in p.stderr and "Redirecting" not in p.stderr


@pytest.mark.parametrize(("args", "words"), [
    (("--endpoint", "ftp://x"), "https://host"),
    (("--min-rate-kib", "nan"), "positive number"),
])  # fmt: skip
def test_bad_options_are_one_line(args: tuple[str, ...], words: str, tmp_path: Path) -> None:
    p = fetch_cli("--repo", "a/b", "--file", "c.gguf", "--dest", str(tmp_path), *args)
    assert p.returncode in (1, 2) and words in p.stderr and "Traceback" not in p.stderr, p.stderr


def test_trickled_response_headers_end_at_the_deadline(tmp_path: Path) -> None:
    """A status line, then one header byte every 0.2 s: no read times out, the header deadline does."""
    import socket
    import threading

    listener = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.recv(65536)
                conn.sendall(b"HTTP/1.1 200 OK\r\n")
                try:
                    while not stop.wait(0.2):
                        conn.sendall(b"X")
                except OSError:
                    continue  # the client gave up: take the retry

    threading.Thread(target=serve, daemon=True).start()
    host = f"127.0.0.1:{listener.getsockname()[1]}"
    started = time.monotonic()
    try:
        p = fetch_cli("--repo", SMALL_REPO, "--file", SMALL_FILE, "--dest", str(tmp_path), "--endpoint",
                      f"http://{host}", "--retries", "1", "--rate-window", str(TRICKLE_WINDOW_S),
                      timeout=60)  # fmt: skip
    finally:
        stop.set()
        listener.close()
    elapsed = time.monotonic() - started
    assert p.returncode == 1, p.stderr
    assert f"sent no complete response headers within {TRICKLE_WINDOW_S:.0f} s" in p.stderr and host in p.stderr
    assert "Traceback" not in p.stderr
    print(f"trickled headers: refused after {elapsed:.1f} s with a {TRICKLE_WINDOW_S} s deadline and 1 retry")
