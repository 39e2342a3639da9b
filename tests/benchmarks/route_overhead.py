"""What the shared endpoint's forward costs a request: streamed chat requests for one model, direct to the hop that
serves it and through another fleet's hop that forwards it there (`--route`, gguf_serve/container/hop/models.py),
the path a client takes at EKS's shared endpoint when it names the model in the body only (without the load
balancer's hop between, which both paths would have alike).

Two hops in their own processes, as instances start them: B serves "served-model" from a llama-server-shaped SSE
upstream (sse_upstream.py: costs next to nothing, so what differs is the hop's work), A serves another name and routes
"served-model" to B. Rounds of `--streams` concurrent requests alternate between the paths (direct, routed, routed,
direct, ...) so that load from other processes hits both alike. Prints client-side TTFT p50/p99 per path, their
difference, the same difference between the direct path's own rounds (the noise here), and the whole stream's time.

    .venv/bin/python tests/benchmarks/route_overhead.py --streams 1 8 --requests 64 --max-tokens 32 --gap-ms 20

Not a test: it prints numbers (docs/eks.md, "One endpoint for several models", quotes them).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from hop_chaos import pct  # noqa: E402
from hop_cpu import one as stream_once  # noqa: E402
from hop_cpu import start  # noqa: E402

from gguf_serve.local.process import free_port  # noqa: E402

KEY = "route-overhead-key"
MODEL = "served-model"
HOST = "127.0.0.1"


def start_hop(port: int, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "BENCH_KEY": KEY}
    cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"{HOST}:{port}", "--api-key-env", "BENCH_KEY"]
    return subprocess.Popen([*cmd, "--gpu-metrics", "off", *args], env=env, stderr=subprocess.DEVNULL)


def wait_up(port: int, proc: subprocess.Popen) -> None:
    import urllib.request

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the hop on {port} did not come up")


async def one(port: int, tokens: int, gap_ms: float) -> tuple[float, float]:
    """One streamed request for MODEL on a fresh connection: (TTFT, whole stream) in seconds."""
    ttfts: list[float] = []
    start_s = time.perf_counter()
    seen = await stream_once(port, tokens, gap_ms, ttfts, model=MODEL, key=KEY)
    if not ttfts or seen < tokens:
        raise RuntimeError(f"a stream on {port} came back with {seen} of {tokens} tokens")
    return ttfts[0], time.perf_counter() - start_s


async def round_of(port: int, streams: int, tokens: int, gap_ms: float) -> list[tuple[float, float]]:
    return list(await asyncio.gather(*(one(port, tokens, gap_ms) for _ in range(streams))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--requests", type=int, default=64, help="requests per path at each concurrency")
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--gap-ms", type=float, default=20.0, help="time between tokens upstream (20 ms: 50 tok/s)")
    a = ap.parse_args()
    upstream, up_port = start([sys.executable, str(ROOT / "tests" / "benchmarks" / "sse_upstream.py")])
    b_port, a_port = free_port(), free_port()
    slots = str(max(a.streams))
    hops = [start_hop(b_port, "--upstream", f"http://{HOST}:{up_port}", "--served-model", MODEL, "--slots", slots)]
    hops.append(start_hop(a_port, "--upstream", f"http://{HOST}:{up_port}", "--served-model", "another-model",
                          "--slots", slots, "--route", f"{MODEL}=http://{HOST}:{b_port}"))  # fmt: skip
    load_before = os.getloadavg()
    table = []
    try:
        for port, proc in ((b_port, hops[0]), (a_port, hops[1])):
            wait_up(port, proc)
        ports = {"direct": b_port, "routed": a_port}
        for path in ports:  # warm both paths (imports, first connections)
            asyncio.run(round_of(ports[path], 2, 4, 0))
        for streams in a.streams:
            rounds = max(2, a.requests // streams)
            seen: dict[str, list[tuple[float, float]]] = {"direct": [], "routed": [], "even": [], "odd": []}
            for i in range(rounds):
                for path in ("direct", "routed") if i % 2 == 0 else ("routed", "direct"):
                    got = asyncio.run(round_of(ports[path], streams, a.max_tokens, a.gap_ms))
                    seen[path] += got
                    if path == "direct":
                        seen["odd" if i % 2 else "even"] += got
            table.append((streams, rounds * streams, seen))
    finally:
        for proc in (*hops, upstream):
            proc.terminate()
            proc.wait(10)
    load_after = os.getloadavg()
    print(f"\nmax_tokens {a.max_tokens}, a token every {a.gap_ms:g} ms upstream; {os.cpu_count()} CPUs "
          f"({platform.machine()}), Python {platform.python_version()}; load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after (1-minute)")  # fmt: skip
    print(
        "| streams | requests per path | TTFT p50 direct / routed ms | routed - direct p50 | TTFT p99 direct / "
        "routed ms | routed - direct p99 | direct - direct p50 (the noise) | stream p50 direct / routed ms |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for streams, requests, seen in table:
        d, r, even, odd = ([1000 * t for t, _ in seen[k]] for k in ("direct", "routed", "even", "odd"))
        ds, rs = ([1000 * w for _, w in seen[k]] for k in ("direct", "routed"))
        print(f"| {streams} | {requests} | {pct(d, 0.5):.2f} / {pct(r, 0.5):.2f} | {pct(r, 0.5) - pct(d, 0.5):+.2f} ms "
              f"| {pct(d, 0.99):.2f} / {pct(r, 0.99):.2f} | {pct(r, 0.99) - pct(d, 0.99):+.2f} ms "
              f"| {pct(odd, 0.5) - pct(even, 0.5):+.2f} ms | {pct(ds, 0.5):.1f} / {pct(rs, 0.5):.1f} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
