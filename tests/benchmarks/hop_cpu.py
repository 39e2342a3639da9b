"""The hop's CPU per streamed token, alone: a llama-server-shaped SSE upstream (tests/benchmarks/sse_upstream.py,
next to no CPU) behind the real hop process, --streams concurrent streamed requests of --tokens tokens each through it.

Prints the hop process's CPU time (user + system, from /proc, sampled at the clock tick) and its run time as the
scheduler counts it (schedstat, exact) per streamed token and per request, measured after a warm-up, with the load
average; with --callgrind the hop runs under valgrind's callgrind and the script prints
instructions per token as well (counters zeroed after the warm-up, dumped after the run): a figure that other
processes on a shared machine cannot move. --loop picks the hop's event loop (uvloop, its default, or asyncio's own).
--relay floor puts a byte relay in C (relay_floor.c, compiled with cc) where the hop was: what the wake-up, epoll,
read and write of one token cost on this machine whatever does them, the floor under the hop's figure.

    .venv/bin/python tests/benchmarks/hop_cpu.py --streams 1 8 64 --tokens 256
    .venv/bin/python tests/benchmarks/hop_cpu.py --streams 8 --tokens 64 --requests 8 --callgrind
    .venv/bin/python tests/benchmarks/hop_cpu.py --streams 1 8 --tokens 1 --requests 16 --callgrind  # per request
    .venv/bin/python tests/benchmarks/hop_cpu.py --loop asyncio --streams 1 --tokens 256 --requests 16 --gap-ms 20
    .venv/bin/python tests/benchmarks/hop_cpu.py --relay floor --streams 1 --tokens 256 --requests 16 --gap-ms 20

Not a test: it prints numbers (docs/cold-start.md and docs/observability.md quote them).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gguf_serve.container.hop.loop import LOOP_ENV  # noqa: E402
from gguf_serve.local.process import free_port  # noqa: E402

HOST = "127.0.0.1"


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def run_ns(pid: int) -> int:
    """Nanoseconds the process's threads have run so far, as the scheduler counts them (schedstat): exact, where
    /proc/PID/stat's user and system times are sampled at the clock tick (10 ms here)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):  # a thread that ended since the listing
            total += int((task / "schedstat").read_text().split()[0])
    return total


def start(cmd: list[str], env: dict[str, str] | None = None) -> tuple[subprocess.Popen[str], int]:
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})})  # fmt: skip
    assert proc.stdout is not None
    for line in proc.stdout:  # valgrind writes its banner first
        if m := re.search(r"listening on (?:\S+:)?(\d+)", line):
            return proc, int(m[1])
    proc.kill()
    raise RuntimeError(f"{cmd[:3]} did not start")


async def one(
    port: int, tokens: int, gap_ms: float, ttfts: list[float] | None = None, *, model: str | None = None,
    key: str = "k",
) -> int:  # fmt: skip
    """One streamed request on a fresh connection; the content events received (and its TTFT into `ttfts`).
    `model`: the body's model (none by default); `key`: the bearer token."""
    request = {"stream": True, "max_tokens": tokens, "gap_ms": gap_ms, "messages": [{"role": "user", "content": "hi"}]}
    body = json.dumps({**request, **({"model": model} if model else {})}).encode()
    start = time.perf_counter()
    reader, writer = await asyncio.open_connection(HOST, port)
    head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    writer.write(head + b"Authorization: Bearer %b\r\nContent-Length: %d\r\n\r\n%b" % (key.encode(), len(body), body))
    seen, tail = 0, b""
    try:
        while data := await reader.read(65536):
            if not seen and b'"content":"' in data and ttfts is not None:
                ttfts.append(time.perf_counter() - start)
            seen += data.count(b'"content":"')
            tail = (tail + data)[-16:]
            if tail.endswith(b"0\r\n\r\n"):
                break
    finally:
        writer.close()
    return seen


async def load(port: int, streams: int, requests: int, tokens: int, gap_ms: float, ttfts: list | None = None) -> int:
    async def worker() -> int:
        return sum([await one(port, tokens, gap_ms, ttfts) for _ in range(requests)])

    return sum(await asyncio.gather(*(worker() for _ in range(streams))))


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else float("nan")


def ttft_rounds(hop_port: int, up_port: int, streams: int, rounds: int, gap_ms: float) -> dict[str, list[float]]:
    """TTFT of short streamed requests, direct to the upstream and through the hop, rounds alternating."""
    seen: dict[str, list[float]] = {"direct": [], "hop": []}
    for i in range(rounds):
        for path in ("direct", "hop") if i % 2 == 0 else ("hop", "direct"):
            asyncio.run(load(up_port if path == "direct" else hop_port, streams, 1, 8, gap_ms, seen[path]))
    return seen


def callgrind_total(out: Path) -> int:
    """Instructions (Ir) in a callgrind dump's summary line."""
    for line in out.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"no totals in {out}")


def floor_relay(work: Path) -> list[str]:
    """The C byte relay, compiled into `work` (a warning fails it): its command without the upstream's port."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise SystemExit("--relay floor needs a C compiler (apt-get install gcc)")
    binary = work / "relay_floor"
    source = ROOT / "tests/benchmarks/relay_floor.c"
    subprocess.run([cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(binary), str(source)], check=True)
    return [str(binary), HOST, "0", HOST]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 64])
    ap.add_argument("--tokens", type=int, default=256, help="tokens per request")
    ap.add_argument("--requests", type=int, default=0, help="requests per stream (default: 4096 tokens per stream)")
    ap.add_argument("--gap-ms", type=float, default=1.0, help="upstream time between tokens of one stream")
    ap.add_argument("--callgrind", action="store_true", help="run the hop under callgrind: instructions per token")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop", help="the hop's event loop")
    ap.add_argument("--relay", choices=("hop", "floor"), default="hop", help="the hop, or a C byte relay (the floor)")
    ap.add_argument("--ttft-rounds", type=int, default=20, help="rounds per path of the TTFT comparison")
    ap.add_argument("--ttft-gap-ms", type=float, default=25.0, help="token gap in the TTFT rounds (40 tok/s a stream)")
    a = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="hop-cpu-"))
    floor = floor_relay(work) if a.relay == "floor" else None
    upstream, up_port = start([sys.executable, str(ROOT / "tests/benchmarks/sse_upstream.py"), "0"])
    hop_cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"{HOST}:{free_port()}",
               "--upstream", f"http://{HOST}:{up_port}", "--gpu-metrics", "off",
               "--no-api-key", "the benchmark"]  # fmt: skip
    if floor:
        hop_cmd = [*floor, str(up_port)]
    if a.callgrind:
        if not shutil.which("valgrind"):
            raise SystemExit("--callgrind needs valgrind (apt-get install valgrind)")
        hop_cmd = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={work}/cg.%p", "--instr-atstart=yes",
                   *hop_cmd]  # fmt: skip
    rows = []
    try:
        for streams in a.streams:
            # an upstream that serves every stream at once
            slots = [] if floor else ["--slots", str(streams)]
            hop, port = start([*hop_cmd, *slots], {LOOP_ENV: a.loop})
            try:
                requests = a.requests or max(1, 4096 // a.tokens)
                asyncio.run(load(port, min(streams, 4), 1, 16, 0))  # warm-up: imports, first connections
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-z", str(hop.pid)], check=True, capture_output=True)
                (user0, sys0), ran0, t0 = cpu_seconds(hop.pid), run_ns(hop.pid), time.monotonic()
                seen = asyncio.run(load(port, streams, requests, a.tokens, a.gap_ms))
                wall, (user1, sys1), ran = time.monotonic() - t0, cpu_seconds(hop.pid), run_ns(hop.pid) - ran0
                cpu = (user1 - user0, sys1 - sys0)
                instructions = None
                if a.callgrind:
                    subprocess.run(["callgrind_control", "-d", str(hop.pid)], check=True, capture_output=True)
                    dumps = sorted(work.glob(f"cg.{hop.pid}.*"), key=lambda p: p.stat().st_mtime)
                    instructions = callgrind_total(dumps[-1])
                ttft = {} if a.callgrind else ttft_rounds(port, up_port, streams, a.ttft_rounds, a.ttft_gap_ms)
            finally:
                hop.terminate()
                hop.wait(30)
            expected = streams * requests * a.tokens
            if seen != expected:
                raise RuntimeError(f"{streams} streams: {seen} tokens arrived, {expected} sent")
            rows.append((streams, streams * requests, seen, wall, cpu, ran, instructions, ttft))
    finally:
        upstream.terminate()
        upstream.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    what = "the C byte relay (the floor) in place of the hop" if floor else f"the hop on {a.loop}'s loop"
    print(f"hop CPU per streamed token: llama-server-shaped SSE upstream, {a.tokens} tokens per request, "
          f"{a.gap_ms:g} ms between tokens of a stream; {os.cpu_count()} CPUs ({platform.machine()}), "
          f"Python {platform.python_version()}, {what}, "
          f"load average {os.getloadavg()[0]:.2f} at the end"
          + (" (hop under callgrind: CPU times are valgrind's, not the hop's)" if a.callgrind else ""))  # fmt: skip
    print("| streams | requests | tokens | seconds | hop CPU s (user + system) | hop CPU us per token (user + system) "
          "| hop run time us per token (scheduler) | hop CPU ms per request | instructions per token "
          "| instructions per request |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for streams, requests, tokens, wall, (user, system), ran, ins, _ in rows:
        cpu = user + system
        print(
            f"| {streams} | {requests} | {tokens} | {wall:.1f} | {cpu:.2f} ({user:.2f} + {system:.2f}) | "
            f"{1e6 * cpu / tokens:.0f} ({1e6 * user / tokens:.0f} + {1e6 * system / tokens:.0f}) | "
            f"{ran / 1e3 / tokens:.1f} | "
            f"{1e3 * cpu / requests:.1f} | {f'{ins / tokens:,.0f}' if ins else '-'} "
            f"| {f'{ins / requests:,.0f}' if ins else '-'} |"
        )
    if not a.callgrind and a.ttft_rounds:
        print(
            f"\nTTFT of 8-token streamed requests ({a.ttft_gap_ms:g} ms between tokens), direct to the upstream and "
            "through the hop, rounds alternating:"
        )
        print("| streams | requests per path | TTFT p50 direct / hop ms | hop - direct p50 | TTFT p99 direct / hop ms "
              "| hop - direct p99 |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for streams, *_, ttft in rows:
            d, h = [x * 1000 for x in ttft["direct"]], [x * 1000 for x in ttft["hop"]]
            d50, h50, d99, h99 = pct(d, 0.5), pct(h, 0.5), pct(d, 0.99), pct(h, 0.99)
            print(
                f"| {streams} | {len(h)} | {d50:.2f} / {h50:.2f} | {h50 - d50:+.2f} ms | {d99:.2f} / {h99:.2f} "
                f"| {h99 - d99:+.2f} ms |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
