"""The hop (the hop) under load and abuse on loopback, against the real llama-server and Gemma 3 270M GGUF.

Two parts, both printed as numbers:
1. Overhead at --overhead-streams concurrent streamed chat requests, direct to llama-server and through the hop
   (alternating rounds): client-side TTFT p50/p95, inter-token gap p50, generated tok/s (all streams together).
2. Chaos: --streams concurrent valid streams through the hop while --idle connections are held open (half of
   them with a half-sent request head) and --bodies keyless bodies declaring --body-gib GiB arrive at full
   speed; /health is probed every 0.1 s with a 1 s timeout (as a load balancer does). Prints errors among the
   valid streams, /health p50/p99 and failures, the hop's peak RSS (VmHWM) and its RSS at the end.

    # 64-stream overhead; 256 / 1000 / 4 x 1 GiB chaos
    .venv/bin/python tests/benchmarks/hop_chaos.py

tests/container/hop/test_load_chaos.py runs the same chaos with small counts and asserts on it; docs/observability.md
quotes this script's numbers. Loopback only: every socket is 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import os
import platform
import resource
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gguf_serve.catalog import load_catalog  # noqa: E402
from gguf_serve.catalog.local import EMBEDDED_MODEL, local_profile  # noqa: E402
from gguf_serve.local.cache import cache_root  # noqa: E402
from gguf_serve.local.demo import llama_server_binary, source_gguf  # noqa: E402
from gguf_serve.local.process import PACKAGE_ROOT, ServerProcess, free_port, start_server  # noqa: E402

HOST = "127.0.0.1"
GIB = 1024**3
MIB = 1024**2


@dataclass
class Stream:
    ok: bool
    status: int = 0
    ttft_s: float | None = None
    gaps_s: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str = ""


@dataclass
class ChaosResult:
    streams: list[Stream]
    health_s: list[float]  # answered /health probes, seconds
    health_failed: int  # probes with no 200 within 1 s
    hop_peak_rss_mib: float
    hop_end_rss_mib: float
    idle_held: int  # idle connections still open when the streams ended
    bodies: list[str]  # what happened to each keyless body
    seconds: float

    @property
    def errors(self) -> list[Stream]:
        return [s for s in self.streams if not s.ok]


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


async def _read_head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    status_line = await reader.readline()
    status = int(status_line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        name, _, value = line.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    return status, headers


async def _chunks(reader: asyncio.StreamReader, headers: dict[str, str]):
    if headers.get("transfer-encoding", "").lower() == "chunked":
        while True:
            size = int((await reader.readline()).split(b";")[0], 16)
            if size == 0:
                await reader.readline()
                return
            data = await reader.readexactly(size + 2)
            yield data[:-2]
    elif "content-length" in headers:
        yield await reader.readexactly(int(headers["content-length"]))
    else:
        while data := await reader.read(65536):
            yield data


async def stream_chat(port: int, key: str, i: int, max_tokens: int, timeout_s: float = 600) -> Stream:
    """One streamed chat request over a fresh connection; the client's view of its timing."""
    body = json.dumps({
        "model": EMBEDDED_MODEL, "stream": True, "max_tokens": max_tokens, "temperature": 0,
        "messages": [{"role": "user", "content": f"({i}) Explain how a CPU cache works, step by step."}],
    }).encode()  # fmt: skip
    head = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: {HOST}:{port}\r\nAuthorization: Bearer {key}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n").encode()  # fmt: skip
    start = time.perf_counter()
    result = Stream(ok=False)
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(HOST, port)
            try:
                writer.write(head + body)
                result.status, headers = await _read_head(reader)
                last, pending, done = None, b"", False
                async for data in _chunks(reader, headers):
                    pending += data
                    *lines, pending = pending.split(b"\n")
                    now = time.perf_counter()
                    for line in lines:
                        if line.startswith(b"data: [DONE]"):
                            done = True
                        elif line.startswith(b"data: ") and b'"content":"' in line:
                            if result.ttft_s is None:
                                result.ttft_s = now - start
                            elif last is not None:
                                result.gaps_s.append(now - last)
                            last = now
                            result.tokens += 1
                result.ok = result.status == 200 and done and result.tokens > 0
                if not result.ok:
                    result.error = f"status {result.status}, done {done}, {result.tokens} tokens"
            finally:
                writer.close()
    except (OSError, asyncio.IncompleteReadError, TimeoutError, ValueError) as e:
        result.error = f"{type(e).__name__}: {e}"
    return result


async def probe_health(port: int, stop: asyncio.Event, answered: list[float], failed: list[int]) -> None:
    while not stop.is_set():
        start = time.perf_counter()
        try:
            async with asyncio.timeout(1.0):
                reader, writer = await asyncio.open_connection(HOST, port)
                writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                status, _ = await _read_head(reader)
                writer.close()
            if status == 200:
                answered.append(time.perf_counter() - start)
            else:
                failed[0] += 1
        except (OSError, TimeoutError, ValueError, IndexError):
            failed[0] += 1
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 0.1)


async def hold_idle(port: int, n: int) -> list[asyncio.StreamWriter]:
    """n open connections: even ones send nothing, odd ones half a request head (slowloris)."""
    writers = []
    for k in range(n):
        try:
            _, writer = await asyncio.open_connection(HOST, port)
        except OSError:
            break
        if k % 2:
            writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Le")
        writers.append(writer)
    return writers


async def keyless_body(port: int, declared: int, send: int) -> str:
    """A body without a key, declared `declared` bytes, `send` of them sent as fast as the hop takes them,
    until an answer comes (llama-server refuses a keyless request before reading all of its body)."""
    try:
        reader, writer = await asyncio.open_connection(HOST, port)
    except OSError as e:
        return f"connect: {e}"
    piece = b"x" * MIB
    sent = 0
    answer = asyncio.create_task(_read_head(reader))
    try:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n" % declared)  # fmt: skip
        with contextlib.suppress(OSError):
            while sent < send and not answer.done():
                writer.write(piece)
                await writer.drain()
                sent += len(piece)
        async with asyncio.timeout(30):
            status, _ = await answer
        return f"answered {status} after {sent // MIB} MiB sent"
    except (OSError, TimeoutError, ValueError, IndexError, asyncio.IncompleteReadError) as e:
        return f"cut after {sent // MIB} MiB sent ({type(e).__name__})"
    finally:
        answer.cancel()
        writer.close()


def rss_mib(pid: int, key: str = "VmRSS") -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def chaos(
    hop_port: int,
    hop_pid: int,
    key: str,
    *,
    streams: int,
    idle: int,
    bodies: int,
    body_declared: int,
    body_send: int,
    max_tokens: int,
) -> ChaosResult:
    started = time.perf_counter()
    stop = asyncio.Event()
    answered: list[float] = []
    failed = [0]
    health = asyncio.create_task(probe_health(hop_port, stop, answered, failed))
    held = await hold_idle(hop_port, idle)
    body_tasks = [asyncio.create_task(keyless_body(hop_port, body_declared, body_send)) for _ in range(bodies)]
    results = await asyncio.gather(*(stream_chat(hop_port, key, i, max_tokens) for i in range(streams)))
    body_outcomes = await asyncio.gather(*body_tasks)
    still_open = sum(1 for w in held if not w.is_closing() and not w.transport.is_closing())
    stop.set()
    await health
    for w in held:
        w.close()
    return ChaosResult(
        streams=list(results),
        health_s=answered,
        health_failed=failed[0],
        hop_peak_rss_mib=rss_mib(hop_pid, "VmHWM"),
        hop_end_rss_mib=rss_mib(hop_pid),
        idle_held=still_open,
        bodies=list(body_outcomes),
        seconds=time.perf_counter() - started,
    )


def start_hop(upstream: str, port: int, spec: Path, *extra: str, key: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT), "LLAMA_API_KEY": key}
    cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"{HOST}:{port}", "--upstream", upstream,
           "--gpu-metrics", "off", "--spec", str(spec), "--api-key-env", "LLAMA_API_KEY", *extra]  # fmt: skip
    return subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)


@contextlib.contextmanager
def serving(parallel: int, *hop_args: str) -> Iterator[tuple[ServerProcess, int, subprocess.Popen, str]]:
    """The real llama-server (through the launcher, `parallel` slots) and the hop in its own process."""
    key = secrets.token_hex(16)
    model = source_gguf(cache_root())
    profile = local_profile(load_catalog(), port=free_port())
    profile = dataclasses.replace(profile, server=dataclasses.replace(profile.server, parallel=parallel))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))  # this client holds the idle connections too
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(profile, model.parent, binary=llama_server_binary(), api_key=key, workdir=Path(tmp))
        hop_port = free_port()
        hop = start_hop(server.url, hop_port, Path(tmp) / "runtime.json", *hop_args, key=key)
        try:
            server.wait_healthy(timeout=120)
            _wait_port(hop_port)
            yield server, hop_port, hop, key
        finally:
            hop.terminate()
            hop.wait(10)
            server.stop()
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def _wait_port(port: int) -> None:
    import socket

    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection((HOST, port), timeout=1):
            return
        time.sleep(0.05)
    raise RuntimeError(f"the hop did not listen on {port}")


def summarize(rows: list[Stream], seconds: float) -> dict[str, float]:
    ttft = [s.ttft_s * 1000 for s in rows if s.ttft_s is not None]
    gaps = [g * 1000 for s in rows for g in s.gaps_s]
    return {
        "ttft_p50_ms": pct(ttft, 0.5),
        "ttft_p95_ms": pct(ttft, 0.95),
        "itl_p50_ms": pct(gaps, 0.5),
        "tok_s": sum(s.tokens for s in rows) / seconds,
        "errors": sum(1 for s in rows if not s.ok),
    }


async def _round(port: int, key: str, n: int, max_tokens: int, base: int) -> tuple[list[Stream], float]:
    t0 = time.perf_counter()
    rows = await asyncio.gather(*(stream_chat(port, key, base + i, max_tokens) for i in range(n)))
    return list(rows), time.perf_counter() - t0


def overhead(a: argparse.Namespace) -> None:
    with serving(a.parallel, "--queue-per-slot", "256") as (server, hop_port, _hop, key):
        direct_port = int(server.url.rsplit(":", 1)[1])
        asyncio.run(_round(direct_port, key, 4, 8, -10))  # warm up both paths
        asyncio.run(_round(hop_port, key, 4, 8, -20))
        rows: dict[str, list[Stream]] = {"direct": [], "hop": []}
        secs = {"direct": 0.0, "hop": 0.0}
        for r in range(a.rounds):
            for path in ("direct", "hop") if r % 2 == 0 else ("hop", "direct"):
                port = direct_port if path == "direct" else hop_port
                got, s = asyncio.run(_round(port, key, a.overhead_streams, a.max_tokens, r * 1000))
                rows[path] += got
                secs[path] += s
    print(f"overhead: {a.overhead_streams} concurrent streams x {a.rounds} rounds per path, max_tokens "
          f"{a.max_tokens}, {a.parallel} slots, {os.cpu_count()} CPUs ({platform.machine()}), "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"{'path':8} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'ITL p50 ms':>11} {'tok/s':>8} {'errors':>7}")
    summary = {p: summarize(rows[p], secs[p]) for p in rows}
    for p, s in summary.items():
        print(f"{p:8} {s['ttft_p50_ms']:12.1f} {s['ttft_p95_ms']:12.1f} {s['itl_p50_ms']:11.2f} {s['tok_s']:8.1f} "
              f"{s['errors']:7d}")  # fmt: skip
    d, h = summary["direct"], summary["hop"]
    print(f"hop - direct: TTFT p50 {h['ttft_p50_ms'] - d['ttft_p50_ms']:+.1f} ms, p95 "
          f"{h['ttft_p95_ms'] - d['ttft_p95_ms']:+.1f} ms, ITL p50 {h['itl_p50_ms'] - d['itl_p50_ms']:+.2f} ms, "
          f"tok/s {100 * (h['tok_s'] - d['tok_s']) / d['tok_s']:+.1f}%")  # fmt: skip


def run_chaos(parallel: int, *, streams: int, idle: int, bodies: int, body_declared: int, body_send: int,
              max_tokens: int, max_body_mib: int) -> ChaosResult:  # fmt: skip
    queue = max(0, -(-(streams + bodies) // parallel) - 1)  # admit them all: this part is not about shedding
    args = ("--queue-per-slot", str(queue), "--max-body-mib", str(max_body_mib), "--max-connections", str(idle + 512))
    with serving(parallel, *args) as (_server, hop_port, hop, key):
        asyncio.run(stream_chat(hop_port, key, -1, 4))  # warm up
        return asyncio.run(chaos(hop_port, hop.pid, key, streams=streams, idle=idle, bodies=bodies,
                                 body_declared=body_declared, body_send=body_send, max_tokens=max_tokens))  # fmt: skip


def print_chaos(r: ChaosResult, a: argparse.Namespace) -> None:
    print(f"chaos: {a.streams} valid streams, {a.idle} idle connections, {a.bodies} keyless bodies of "
          f"{a.body_gib} GiB declared, body cap {a.max_body_mib} MiB, {a.parallel} slots: "
          f"{r.seconds:.1f} s")  # fmt: skip
    print(f"  valid streams: {len(r.streams) - len(r.errors)} ok, {len(r.errors)} errors"
          + (f" (first: {r.errors[0].error})" if r.errors else ""))  # fmt: skip
    print(f"  /health: {len(r.health_s)} answered, p50 {1000 * pct(r.health_s, 0.5):.1f} ms, "
          f"p99 {1000 * pct(r.health_s, 0.99):.1f} ms, max {1000 * max(r.health_s, default=0):.1f} ms, "
          f"{r.health_failed} without a 200 within 1 s")  # fmt: skip
    print(f"  hop RSS: peak {r.hop_peak_rss_mib:.1f} MiB, at the end {r.hop_end_rss_mib:.1f} MiB")
    print(f"  idle connections held by this client: {r.idle_held} of {a.idle} (the hop answers the half-sent "
          "heads 408 after 10 s; this client does not read them)")  # fmt: skip
    print(f"  keyless bodies: {'; '.join(r.bodies)}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parallel", type=int, default=4, help="llama-server slots (default %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--overhead-streams", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=2, help="overhead rounds per path (default %(default)s)")
    ap.add_argument("--streams", type=int, default=256)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--body-gib", type=float, default=1.0, help="declared size of each keyless body")
    ap.add_argument("--body-send-mib", type=int, help="bytes of it sent (default: all)")
    ap.add_argument("--max-body-mib", type=int, default=64, help="the hop's body cap (its default: 64)")
    ap.add_argument("--skip-overhead", action="store_true")
    ap.add_argument("--skip-chaos", action="store_true", help="only the overhead part")
    a = ap.parse_args()
    if not a.skip_overhead:
        overhead(a)
    if a.skip_chaos:
        return 0
    declared = int(a.body_gib * GIB)
    send = declared if a.body_send_mib is None else a.body_send_mib * MIB
    r = run_chaos(a.parallel, streams=a.streams, idle=a.idle, bodies=a.bodies, body_declared=declared,
                  body_send=send, max_tokens=a.max_tokens, max_body_mib=a.max_body_mib)  # fmt: skip
    print_chaos(r, a)
    return 1 if r.errors else 0


if __name__ == "__main__":
    sys.exit(main())
