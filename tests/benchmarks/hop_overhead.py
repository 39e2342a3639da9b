"""What the timing hop (the hop) costs: the same streamed requests direct to llama-server and through it.

Starts the real llama-server (scripts/build-llama-server.sh, cached) with the real Gemma 3 270M GGUF through the
launcher, and the hop in its own process, as the instance and the workstation run it. Sends --requests streamed
chat requests each way, interleaved (direct, hop, direct, ...) so that load from other processes hits both
alike, with the OpenAI client, and prints client-side TTFT and decode tok/s for each path and the difference.

    .venv/bin/python tests/benchmarks/hop_overhead.py --requests 30 --max-tokens 64

Not a test: it prints numbers (docs/observability.md quotes them).
"""

from __future__ import annotations

import argparse
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gguf_serve.catalog import load_catalog  # noqa: E402
from gguf_serve.catalog.local import local_profile  # noqa: E402
from gguf_serve.local.cache import cache_root  # noqa: E402
from gguf_serve.local.demo import llama_server_binary, source_gguf  # noqa: E402
from gguf_serve.local.process import PACKAGE_ROOT, free_port, start_server  # noqa: E402


def start_hop(upstream: str, port: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}", "--upstream", upstream]
    return subprocess.Popen([*cmd, "--gpu-metrics", "off"], env=env, stderr=subprocess.DEVNULL)


def one_request(client, i: int, max_tokens: int) -> tuple[float, float, int]:
    """(TTFT s, decode tok/s after the first token, content chunks) as the client sees them."""
    start = time.perf_counter()
    first = last = None
    chunks = 0
    stream = client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"({i}) Explain how a CPU cache works, step by step."}],
        max_tokens=max_tokens,
        temperature=0,
        stream=True,
    )
    for event in stream:
        if event.choices and event.choices[0].delta.content:
            now = time.perf_counter()
            first = first or now
            last = now
            chunks += 1
    if first is None or last is None or chunks < 2:
        raise RuntimeError(f"request {i}: fewer than 2 content chunks")
    return first - start, (chunks - 1) / (last - first), chunks


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a process so far (Linux /proc)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=30, help="per path (default 30)")
    ap.add_argument("--max-tokens", type=int, default=64)
    a = ap.parse_args()
    from openai import OpenAI

    key = secrets.token_urlsafe(16)
    model = source_gguf(cache_root())
    profile = local_profile(load_catalog(), port=free_port())
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(profile, model.parent, binary=llama_server_binary(), api_key=key, workdir=Path(tmp))
        hop_port = free_port()
        hop = start_hop(server.url, hop_port)
        try:
            server.wait_healthy(timeout=120)
            clients = {
                "direct": OpenAI(base_url=f"{server.url}/v1", api_key=key, max_retries=0),
                "hop": OpenAI(base_url=f"http://127.0.0.1:{hop_port}/v1", api_key=key, max_retries=0),
            }
            for c in clients.values():  # warm both paths (connection pools, the server's first-request costs)
                one_request(c, -1, 8)
            rows: dict[str, list[tuple[float, float, int]]] = {"direct": [], "hop": []}
            hop_cpu_start = cpu_seconds(hop.pid)  # after start-up and warm-up: what serving costs
            for i in range(a.requests):
                for path in ("direct", "hop") if i % 2 == 0 else ("hop", "direct"):
                    rows[path].append(one_request(clients[path], i, a.max_tokens))
            hop_cpu_s = cpu_seconds(hop.pid) - hop_cpu_start
        finally:
            hop.terminate()
            hop.wait(10)
            server.stop()
    load = os.getloadavg()[0]
    print(
        f"{a.requests} streamed requests per path, max_tokens {a.max_tokens}, {os.cpu_count()} CPUs "
        f"({platform.machine()}), load average {load:.2f}, Gemma 3 270M Q4_K_M, {profile.server.parallel} slots"
    )
    print(f"{'path':8} {'TTFT p50 ms':>12} {'TTFT p95 ms':>12} {'tok/s p50':>10} {'tok/s mean':>11}")
    summary = {}
    for path, r in rows.items():
        ttft = [x[0] * 1000 for x in r]
        tps = [x[1] for x in r]
        summary[path] = (statistics.median(ttft), pct(ttft, 0.95), statistics.median(tps), statistics.mean(tps))
        print(
            f"{path:8} {summary[path][0]:12.1f} {summary[path][1]:12.1f} {summary[path][2]:10.1f} "
            f"{summary[path][3]:11.1f}"
        )
    d, h = summary["direct"], summary["hop"]
    print(
        f"hop - direct: TTFT p50 {h[0] - d[0]:+.1f} ms, p95 {h[1] - d[1]:+.1f} ms; "
        f"decode tok/s p50 {h[2] - d[2]:+.1f} ({100 * (h[2] - d[2]) / d[2]:+.1f}%)"
    )
    chunks = sum(x[2] for x in rows["hop"])
    print(
        f"hop process CPU: {hop_cpu_s:.2f} s for {a.requests} requests ({chunks} content chunks): "
        f"{1000 * hop_cpu_s / a.requests:.1f} ms per request, {1e6 * hop_cpu_s / chunks:.0f} us per chunk"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
