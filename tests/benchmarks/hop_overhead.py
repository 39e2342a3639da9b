"""What the timing hop costs a client: the same streamed chat requests direct to llama-server and through the hop, at
1, 8 and 64 concurrent streams, and the hop's CPU per streamed token.

Starts the real llama-server (scripts/build-llama-server.sh, cached) with the real Gemma 3 270M GGUF through the
launcher, and the hop in its own process, as the instance and the workstation run it. At each concurrency, rounds of
that many streamed requests alternate between the two paths (direct, hop, hop, direct, ...) so that load from other
processes hits both alike. Prints client-side TTFT p50 and p99 per path and their difference (in ms and in % of
direct), beside the same difference with no hop in it (the direct path's rounds that went first in their pair
against those that went second: how far apart two runs of one path fall here), the mean time between a stream's
tokens on each path (whether the hop's CPU, taken from llama-server's cores, slows its decode), and the hop process's
run time as the scheduler counts it (/proc/PID/task/*/schedstat, exact) per streamed token and per request during
its rounds. --threads sets llama-server's threads (default: one per physical core, as every profile runs it);
--threads 1 on two cores leaves the hop a core of its own. --pin goes further and gives llama-server cores of its own,
as a host with cores to spare would: llama-server (and its threads, one per core it gets) on every CPU but the last,
the hop and this client on the last (sched_setaffinity, which children inherit), so that the hop's wake-ups neither
take a compute thread's core nor share a core with the model's weights (CPUs as the kernel numbers them: on a host
with SMT the last may be a sibling of one of llama-server's, and --threads counts CPUs, not physical cores, there).
--samples FILE writes every request's TTFT and gaps per path (JSON), to see whether a p99 is one path's or the host's.
--relay floor puts hop_cpu.py's C byte relay where the hop was: what a relay that parses nothing costs per token
beside the real llama-server, which wakes a relay once per token after an idle gap.

    .venv/bin/python tests/benchmarks/hop_overhead.py --streams 1 8 64 --max-tokens 64
    .venv/bin/python tests/benchmarks/hop_overhead.py --relay floor --streams 1 8 --max-tokens 64
    .venv/bin/python tests/benchmarks/hop_overhead.py --threads 1 --streams 1 8 --max-tokens 64
    .venv/bin/python tests/benchmarks/hop_overhead.py --pin --streams 1 8 64 --requests 32 --max-tokens 64

tests/benchmarks/hop_cpu.py measures the hop's CPU alone (a synthetic upstream, optionally instructions under
callgrind). Not a test: it prints numbers (docs/cold-start.md and docs/observability.md quote them).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import secrets
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from hop_chaos import Stream, pct, stream_chat  # noqa: E402
from hop_cpu import floor_relay, run_ns, start  # noqa: E402

from gguf_serve.catalog import load_catalog  # noqa: E402
from gguf_serve.catalog.local import local_profile  # noqa: E402
from gguf_serve.local.cache import cache_root  # noqa: E402
from gguf_serve.local.demo import llama_server_binary, source_gguf  # noqa: E402
from gguf_serve.local.process import PACKAGE_ROOT, free_port, start_server  # noqa: E402


def start_hop(upstream: str, port: int, slots: int) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)}
    cmd = [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}", "--upstream", upstream]
    cmd += ["--slots", str(slots), "--gpu-metrics", "off", "--no-api-key", "the benchmark (llama-server checks it)"]
    return subprocess.Popen(cmd, env=env, stderr=subprocess.DEVNULL)


async def round_of(port: int, key: str, streams: int, first: int, max_tokens: int) -> list[Stream]:
    return list(await asyncio.gather(*(stream_chat(port, key, first + k, max_tokens) for k in range(streams))))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="+", default=[1, 8, 64], help="concurrent streams per round")
    ap.add_argument(
        "--requests", type=int, default=64, help="requests per path at each concurrency (at least 2 rounds)"
    )
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--parallel", type=int, default=4, help="llama-server slots (default %(default)s)")
    ap.add_argument("--relay", choices=("hop", "floor"), default="hop", help="the hop, or a C byte relay (the floor)")
    ap.add_argument("--threads", type=int, help="llama-server threads (default: the profile's, one per physical core)")
    ap.add_argument("--pin", action="store_true", help="llama-server on all CPUs but the last; the hop, client on it")
    ap.add_argument("--samples", type=Path, help="write each request's TTFT and gaps per path to this JSON file")
    a = ap.parse_args()
    cpus = sorted(os.sched_getaffinity(0))
    if a.pin and len(cpus) < 2:
        ap.error(f"--pin needs at least 2 CPUs; this process may run on {len(cpus)}")
    server_cpus, hop_cpus = (set(cpus[:-1]), {cpus[-1]}) if a.pin else (set(cpus), set(cpus))

    key = secrets.token_urlsafe(16)
    model = source_gguf(cache_root())
    profile = local_profile(load_catalog(), port=free_port())
    threads = a.threads or (len(server_cpus) if a.pin else profile.server.threads)
    server_flags = dataclasses.replace(profile.server, parallel=a.parallel, threads=threads)
    profile = dataclasses.replace(profile, server=server_flags)
    load_before = os.getloadavg()
    table = []
    with tempfile.TemporaryDirectory() as tmp:
        os.sched_setaffinity(0, server_cpus)  # llama-server inherits it, then the hop and this client the other
        server = start_server(profile, model.parent, binary=llama_server_binary(), api_key=key, workdir=Path(tmp))
        os.sched_setaffinity(0, hop_cpus)
        direct_port = int(server.url.rsplit(":", 1)[1])
        hop: subprocess.Popen | None = None
        try:
            if a.relay == "floor":  # hop_cpu.start reads the port the relay prints once bound
                hop, hop_port = start([*floor_relay(Path(tmp)), str(direct_port)])
            else:
                hop_port = free_port()
                hop = start_hop(server.url, hop_port, a.parallel)
            ports = {"direct": direct_port, "hop": hop_port}
            server.wait_healthy(timeout=120)
            for path in ports:  # warm both paths (the server's first-request costs, the hop's imports)
                asyncio.run(round_of(ports[path], key, 2, -2, 8))
            for streams in a.streams:
                rounds = max(2, a.requests // streams)
                seen: dict[str, list[Stream]] = {"direct": [], "hop": [], "direct-even": [], "direct-odd": []}
                hop_ns = 0
                for i in range(rounds):
                    for path in ("direct", "hop") if i % 2 == 0 else ("hop", "direct"):
                        before = run_ns(hop.pid)
                        # Prompts never repeat across paths: with the same prompt in both of a round's halves, the
                        # second found it whole in llama-server's prompt cache (-30% to -50% TTFT at one stream).
                        first = (i * streams) * 2 + (streams if path == "hop" else 0)
                        got = asyncio.run(round_of(ports[path], key, streams, first, a.max_tokens))
                        seen[path] += got
                        if path == "hop":
                            hop_ns += run_ns(hop.pid) - before
                        else:
                            seen["direct-odd" if i % 2 else "direct-even"] += got
                bad = [s.error for r in seen.values() for s in r if not s.ok]
                if bad:
                    raise RuntimeError(f"{len(bad)} streams failed at {streams} streams: {bad[:3]}")
                table.append((streams, rounds * streams, seen, hop_ns / 1e9))
                print(f"{streams} streams done", flush=True)
        finally:
            if hop is not None:
                hop.terminate()
                hop.wait(10)
            server.stop()
    load_after = os.getloadavg()
    if a.samples:
        a.samples.write_text(json.dumps({
            str(streams): {path: [{"ttft_s": s.ttft_s, "gaps_s": s.gaps_s} for s in seen[path]]
                           for path in ("direct", "hop")}
            for streams, _, seen, _ in table
        }))  # fmt: skip
    print(f"\nGemma 3 270M Q4_K_M on llama-server ({a.parallel} slots, {profile.threads} threads), "
          f"max_tokens {a.max_tokens}; "
          f"{os.cpu_count()} CPUs ({platform.machine()}), Python {platform.python_version()}; "
          f"load average {load_before[0]:.2f} before, "
          f"{load_after[0]:.2f} after (1-minute), {load_after[2]:.2f} (15-minute)"
          + ("; the C byte relay (the floor) in place of the hop" if a.relay == "floor" else "")
          + (f"; llama-server on CPUs {sorted(server_cpus)}, the relay and client on {sorted(hop_cpus)}"
             if a.pin else ""))  # fmt: skip
    print("| streams | requests per path | TTFT p50 direct / hop ms | hop - direct p50 | TTFT p99 direct / hop ms "
          "| hop - direct p99 | direct - direct p50 / p99 (the noise) | between tokens direct / hop ms "
          "| hop - direct between tokens (noise) | hop run time per token (us) "
          "| hop run time per request (ms) |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for streams, requests, seen, hop_run in table:
        d, h, even, odd = ([s.ttft_s * 1000 for s in seen[k] if s.ttft_s is not None]
                           for k in ("direct", "hop", "direct-even", "direct-odd"))  # fmt: skip
        d50, h50, d99, h99 = pct(d, 0.5), pct(h, 0.5), pct(d, 0.99), pct(h, 0.99)
        # The same comparison with no hop in it: the direct path's rounds that went first in their pair against
        # those that went second. A hop - direct figure inside this one is not told apart from chance here.
        a50, a99 = pct(odd, 0.5) - pct(even, 0.5), pct(odd, 0.99) - pct(even, 0.99)
        # Mean time between a stream's tokens (all gaps of a path over their count): the decode rate the client
        # sees, which slows if the hop's wake-ups take a core from llama-server's compute threads.
        g, gh, ge, go = (mean_gap_ms(seen[k]) for k in ("direct", "hop", "direct-even", "direct-odd"))
        tokens = sum(s.tokens for s in seen["hop"])
        print(f"| {streams} | {requests} | {d50:.1f} / {h50:.1f} "
              f"| {h50 - d50:+.1f} ms ({100 * (h50 - d50) / d50:+.1f}%) "
              f"| {d99:.1f} / {h99:.1f} | {h99 - d99:+.1f} ms ({100 * (h99 - d99) / d99:+.1f}%) "
              f"| {100 * a50 / d50:+.1f}% / {100 * a99 / d99:+.1f}% "
              f"| {g:.2f} / {gh:.2f} | {100 * (gh - g) / g:+.1f}% ({100 * (go - ge) / ge:+.1f}%) "
              f"| {1e6 * hop_run / tokens:.0f} | {1e3 * hop_run / requests:.1f} |")  # fmt: skip
    return 0


def mean_gap_ms(streams: list[Stream]) -> float:
    gaps = [gap for s in streams for gap in s.gaps_s]
    return 1000 * sum(gaps) / len(gaps) if gaps else float("nan")


if __name__ == "__main__":
    sys.exit(main())
