"""Keyless clients against the hop on loopback, in front of the real llama-server and Gemma 3 270M GGUF (issue 31).

Three parts, each printed as numbers, for the hop of this tree or of another (`--hop-tree`, e.g. a checkout of an
earlier commit: the before/after of a fix):
1. Slow keyless bodies: --slow connections send a keyless POST head declaring 1 MiB, then a byte every 2 s, at a
   connection cap of --slow-cap. Printed: connections the hop still holds after --hold s, and /health probes
   (a new connection each, as the load balancer makes) answered 200 within 1 s.
2. A keyless flood: --flood tasks send keyless chat requests as fast as they are answered for --seconds, while 2
   keyed clients send short ones; llama-server has 2 slots and the hop admits 2 (queue_per_slot 0), so every keyed
   request has a place unless keyless ones take it. Printed: the answers by status on each side and the hop's shed
   counter (what scales the fleet out).
3. A burst of --burst silent connections at the default cap (4,096) with the open-files limit the hop sets
   itself: the hop's connection count and open files after it, "Too many open files" lines in its log, /health.

    .venv/bin/python tests/benchmarks/hop_keyless.py                        # this tree's hop
    .venv/bin/python tests/benchmarks/hop_keyless.py --hop-tree ../before   # another checkout's hop

tests/container/hop/test_keyless_e2e.py runs the same parts with small counts and asserts on them.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gguf_serve.catalog import load_catalog  # noqa: E402
from gguf_serve.catalog.local import EMBEDDED_MODEL, local_profile  # noqa: E402
from gguf_serve.container.metrics.prometheus import parse_prometheus  # noqa: E402
from gguf_serve.local.cache import cache_root  # noqa: E402
from gguf_serve.local.demo import llama_server_binary, source_gguf  # noqa: E402
from gguf_serve.local.process import PACKAGE_ROOT, free_port, start_server  # noqa: E402
from tests.benchmarks.hop_chaos import HOST, _read_head, _wait_port, rss_mib  # noqa: E402

CHAT = json.dumps({"model": EMBEDDED_MODEL, "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}).encode()


@dataclass
class Hop:
    port: int
    proc: subprocess.Popen
    key: str
    log: Path

    def fds(self) -> int:
        return len(os.listdir(f"/proc/{self.proc.pid}/fd"))

    def log_lines(self, text: str) -> int:
        return sum(text in line for line in self.log.read_text(errors="replace").splitlines())


@contextlib.contextmanager
def serving(tree: Path, *hop_args: str, with_key: bool = True) -> Iterator[Hop]:
    """llama-server (2 slots, through the launcher) and the hop of `tree` in its own process, admitting 2."""
    import dataclasses

    key = secrets.token_hex(16)
    profile = local_profile(load_catalog(), port=free_port())
    profile = dataclasses.replace(profile, server=dataclasses.replace(profile.server, parallel=2))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds thousands of connections
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(profile, source_gguf(cache_root()).parent, binary=llama_server_binary(), api_key=key,
                              workdir=Path(tmp))  # fmt: skip
        port, log = free_port(), Path(tmp) / "hop.log"
        # without the key: as the EKS manifests started it before round 4 (a hop of today must be told so)
        args = ["--api-key-env", "LLAMA_API_KEY"] if with_key else ["--no-api-key", "the benchmark: keyless on purpose"]
        cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"{HOST}:{port}", "--upstream",
               server.url, "--gpu-metrics", "off", "--slots", "2", "--queue-per-slot", "0", *args,
               *hop_args]  # fmt: skip
        env = {**os.environ, "PYTHONPATH": str(tree), "LLAMA_API_KEY": key}
        with log.open("wb") as out:
            # the hop starts with the open-files limit it would have as a service, and raises it as it does there
            proc = subprocess.Popen(
                cmd,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=tree,
                preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard)),
            )  # noqa: PLW1509 - fmt: skip
        try:
            server.wait_healthy(timeout=120)
            _wait_port(port)
            yield Hop(port, proc, key, log)
        finally:
            stopping = time.monotonic()
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            tracebacks = sum("Traceback" in line for line in log.read_text(errors="replace").splitlines())
            print(f"  the hop stopped {time.monotonic() - stopping:.1f} s after SIGTERM, {tracebacks} tracebacks "
                  "in its log", flush=True)  # fmt: skip
            server.stop()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


async def _health(port: int) -> bool:
    try:
        async with asyncio.timeout(1.0):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            status, _ = await _read_head(reader)
            writer.close()
            return status == 200
    except (OSError, TimeoutError, ValueError, IndexError):
        return False


async def _alive(writer: asyncio.StreamWriter, reader: asyncio.StreamReader) -> bool:
    """Whether the hop still holds this connection (it has not closed its side)."""
    if writer.is_closing():
        return False
    with contextlib.suppress(TimeoutError, OSError):
        async with asyncio.timeout(0.01):
            await reader.read(65536)
            return not reader.at_eof()
    return not reader.at_eof()


async def slow_bodies(port: int, n: int, hold_s: float) -> dict:
    conns = []
    for _ in range(n):
        with contextlib.suppress(OSError):
            reader, writer = await asyncio.open_connection(HOST, port)
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1048576\r\n\r\n{")
            conns.append((reader, writer))

    async def trickle(writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError, ConnectionError):
            while not writer.is_closing():
                await asyncio.sleep(2)
                writer.write(b" ")
                await writer.drain()

    tasks = [asyncio.create_task(trickle(w)) for _, w in conns]
    await asyncio.sleep(hold_s)
    probes = [await _health(port) for _ in range(10)]
    held = sum([await _alive(w, r) for r, w in conns])
    for t in tasks:
        t.cancel()
    for _, w in conns:
        w.close()
    return {"opened": len(conns), "held": held, "health_ok": sum(probes), "health_probes": len(probes)}


async def _chat(port: int, key: str | None) -> int:
    try:
        async with asyncio.timeout(30):
            reader, writer = await asyncio.open_connection(HOST, port)
            auth = f"Authorization: Bearer {key}\r\n".encode() if key else b""
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n%bContent-Type: application/json\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n%b" % (auth, len(CHAT), CHAT))  # fmt: skip
            status, _ = await _read_head(reader)
            writer.close()
            return status
    except (OSError, TimeoutError, ValueError, IndexError):
        return 0


async def flood(port: int, key: str, tasks: int, seconds: float) -> dict:
    keyless: Counter[int] = Counter()
    keyed: Counter[int] = Counter()
    end = time.monotonic() + seconds

    async def loop(counter: Counter[int], with_key: str | None) -> None:
        while time.monotonic() < end:
            counter[await _chat(port, with_key)] += 1

    keyed_clients = 2  # as many as the hop admits: each should always find a place
    await asyncio.gather(
        *(loop(keyless, None) for _ in range(tasks)), *(loop(keyed, key) for _ in range(keyed_clients))
    )
    return {"keyless": dict(keyless), "keyed": dict(keyed)}


async def burst(hop: Hop, n: int) -> dict:
    writers = []
    for _ in range(n):
        try:
            _, writer = await asyncio.open_connection(HOST, hop.port)
        except OSError:
            break
        writers.append(writer)
    await asyncio.sleep(2)
    out = {"opened": len(writers), "hop_fds": hop.fds(), "health_ok": sum([await _health(hop.port) for _ in range(5)])}
    out["count"] = await asyncio.to_thread(_gauge, hop, "gguf_serve_connections_open")  # while they are open
    for w in writers:
        w.close()
    return out


def shed(hop: Hop) -> float:
    import urllib.request

    request = urllib.request.Request(
        f"http://{HOST}:{hop.port}/metrics", headers={"Authorization": f"Bearer {hop.key}"}
    )
    with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
        families = parse_prometheus(answer.read().decode())
    return families["gguf_serve_requests_shed_total"].value()


def run(a: argparse.Namespace) -> None:
    """Each part's numbers are printed as soon as they are measured."""
    tree = Path(a.hop_tree).resolve()
    print(f"hop of {tree}:", flush=True)
    with serving(tree, "--max-connections", str(a.slow_cap), with_key=not a.no_key_flag) as hop:
        s = asyncio.run(slow_bodies(hop.port, a.slow, a.hold))
        print(f"  slow keyless bodies: {s['opened']} opened at a cap of {a.slow_cap}, {s['held']} still held after "
              f"{a.hold:.0f} s; /health {s['health_ok']}/{s['health_probes']} answered 200 within 1 s",
              flush=True)  # fmt: skip
        f = asyncio.run(flood(hop.port, hop.key, a.flood, a.seconds))
        print(f"  keyless flood ({a.flood} tasks, {a.seconds:.0f} s, admission 2): keyless answers {f['keyless']}, "
              f"keyed answers {f['keyed']}, shed counter {shed(hop)}; hop peak RSS "
              f"{rss_mib(hop.proc.pid, 'VmHWM'):.1f} MiB", flush=True)  # fmt: skip
    if a.burst:
        with serving(tree, with_key=not a.no_key_flag) as hop:
            b = asyncio.run(burst(hop, a.burst))
            print(f"  burst of {b['opened']} silent connections at the default cap: hop count {b['count']}, hop "
                  f"open files {b['hop_fds']}, 'Too many open files' lines {hop.log_lines('Too many open files')}, "
                  f"/health {b['health_ok']}/5", flush=True)  # fmt: skip


def _gauge(hop: Hop, name: str) -> float | None:
    with contextlib.suppress(Exception):
        import urllib.request

        request = urllib.request.Request(f"http://{HOST}:{hop.port}/metrics",
                                         headers={"Authorization": f"Bearer {hop.key}"})  # fmt: skip
        with urllib.request.urlopen(request, timeout=10) as answer:  # noqa: S310 - loopback
            return parse_prometheus(answer.read().decode())[name].value()
    return None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--hop-tree", default=str(PACKAGE_ROOT), help="the checkout whose hop runs (default: this one)")
    ap.add_argument("--no-key-flag", action="store_true", help="a hop that has no --api-key-env flag (earlier ones)")
    ap.add_argument("--slow", type=int, default=300, help="slow keyless bodies (default %(default)s)")
    ap.add_argument("--slow-cap", type=int, default=256, help="the hop's connection cap for parts 1-2")
    ap.add_argument("--hold", type=float, default=15.0, help="seconds before counting what the hop still holds")
    ap.add_argument("--flood", type=int, default=64, help="keyless flood tasks (default %(default)s)")
    ap.add_argument("--seconds", type=float, default=20.0, help="flood duration")
    ap.add_argument("--burst", type=int, default=8400, help="silent connections at the default cap (0: skip)")
    run(ap.parse_args())
    return 0


if __name__ == "__main__":
    sys.exit(main())
