"""Download benchmark: modelfetch vs a single stream vs the official `modelscope download`, over a capped link.

A random file (hashing is real work) is served by the local hub in its own process, every connection capped at
--cap-mbps. Each tool downloads it to a fresh directory; the script prints MB/s and the share of the link limit
(connections x cap) each reached. Every tool verifies sha256: modelfetch while streaming, `modelscope download
--include` after the download, the single stream while streaming.

    .venv/bin/python tests/benchmarks/fetch_benchmark.py --size-gib 2 --cap-mbps 25

Not a test: it takes a few minutes and prints numbers (docs/model-delivery.md quotes them).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gguf_serve.container.digest import sha256_file  # noqa: E402

REPO = "gguf_serve/local/bench/random-GGUF"
FILE = "random.gguf"


@dataclass
class Run:
    tool: str
    connections: int
    settings: str
    seconds: float
    size: int
    cap_bps: float
    ok: bool
    verified_s: float | None = None  # modelfetch only: until the last byte was hashed (before the final fsync)
    repetition: int = 1  # which run; in the summary table, how many runs

    @property
    def mbps(self) -> float:
        return self.size / self.seconds / 1e6

    @property
    def share(self) -> float:
        return self.mbps * 1e6 / (self.connections * self.cap_bps)


def make_file(path: Path, size: int) -> str:
    side = path.with_name(path.name + ".sha256")
    if path.exists() and path.stat().st_size == size and side.exists():
        return side.read_text().split()[0]
    path.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with path.open("wb") as f:
        left = size
        while left:
            block = os.urandom(min(left, 64 << 20))
            h.update(block)
            f.write(block)
            left -= len(block)
    side.write_text(h.hexdigest() + "\n")
    return h.hexdigest()


def start_hub(root: Path, cap_mbps: float) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "gguf_serve.local.hub", "--root", str(root), "--port", "0",
         "--bandwidth-mbps", str(cap_mbps)],
        cwd=ROOT, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert proc.stdout is not None
    line = proc.stdout.readline()
    m = re.search(r"at (http://\S+)", line)
    if not m:
        proc.kill()
        raise RuntimeError(f"the local hub did not start: {line!r}")
    return proc, m[1]


def run_modelfetch(url: str, dest: Path, sha: str, size: int, connections: int, part_mib: int) -> tuple[float, float]:
    t0 = time.monotonic()
    out = subprocess.run(
        [
            sys.executable, "-m", "gguf_serve.container.fetch", "--repo", REPO, "--file", FILE, "--sha256", sha,
            "--size", str(size),
            "--dest", str(dest), "--endpoint", url, "--connections", str(connections),
            "--part-size-mib", str(part_mib), "--quiet",
        ],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    wall = time.monotonic() - t0
    return wall, json.loads(out.stdout)["verified_seconds"]


def run_single_stream(url: str, dest: Path, sha: str) -> float:
    """One plain HTTP GET, hashed while streaming (what curl | sha256sum would do, minus the slow sha256sum)."""
    t0 = time.monotonic()
    h = hashlib.sha256()
    dest.mkdir(parents=True, exist_ok=True)
    file_url = f"{url}/api/v1/models/{REPO}/repo?Revision=master&FilePath={FILE}"
    with urllib.request.urlopen(file_url) as r, (dest / FILE).open("wb") as f:  # noqa: S310
        while block := r.read(1 << 20):
            h.update(block)
            f.write(block)
    if h.hexdigest() != sha:
        raise RuntimeError("single stream: sha256 mismatch")
    return time.monotonic() - t0


def run_official(url: str, dest: Path, workers: int, part_mb: int, cache: Path) -> float:
    cli = Path(sys.executable).with_name("modelscope")
    env = {
        **os.environ,
        "MODELSCOPE_ENDPOINT": url,
        "MODELSCOPE_CACHE": str(cache),
        "MODELSCOPE_DOWNLOAD_PARALLEL_WORKERS": str(workers),
        "MODELSCOPE_DOWNLOAD_PART_SIZE_MB": str(part_mb),
    }
    t0 = time.monotonic()
    subprocess.run(
        [str(cli), "download", "--model", REPO, "--include", FILE, "--local_dir", str(dest)],
        check=True, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return time.monotonic() - t0


def _medians(runs: list[Run]) -> list[Run]:
    """One row per tool and setting: the run with the median time (all runs must have verified)."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in runs:
        groups.setdefault((r.tool, r.settings), []).append(r)
    out = []
    for group in groups.values():
        ordered = sorted(group, key=lambda r: r.seconds)
        median = ordered[len(ordered) // 2]
        out.append(replace(median, ok=all(r.ok for r in group), repetition=len(group)))
    return out


def check(path: Path, sha: str) -> bool:
    return sha256_file(path) == sha


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=2.0)
    ap.add_argument("--cap-mbps", type=float, default=25.0, help="per-connection cap, MB/s (10^6 bytes)")
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "modelfetch-bench")
    ap.add_argument("--connections", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--part-mib", type=int, default=16, help="modelfetch part size")
    ap.add_argument("--official", default="8:32,16:32,16:160", help="official CLI runs, workers:part_mb,...")
    ap.add_argument("--skip-single", action="store_true")
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting; the table shows the median")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()

    size = int(a.size_gib * 1024**3)
    root = a.work / "hub"
    print(f"preparing {size / 1e9:.2f} GB of random bytes in {root} ...", flush=True)
    sha = make_file(root / REPO / FILE, size)
    proc, url = start_hub(root, a.cap_mbps)
    cap = a.cap_mbps * 1e6
    runs: list[Run] = []
    try:

        def fresh(name: str) -> Path:
            d = a.work / "out" / name
            shutil.rmtree(d, ignore_errors=True)
            return d

        if not a.skip_single:
            d = fresh("single")
            s = run_single_stream(url, d, sha)
            runs.append(Run("single stream (urllib, sha256 while streaming)", 1, "-", s, size, cap, True))
            shutil.rmtree(d)
            print(runs[-1], flush=True)
        for rep in range(1, a.repeat + 1):  # interleaved, so a busy moment on the machine hits every tool alike
            for n in a.connections:
                d = fresh(f"modelfetch-{n}")
                s, verified = run_modelfetch(url, d, sha, size, n, a.part_mib)
                runs.append(Run("modelfetch", n, f"--connections {n} --part-size-mib {a.part_mib}", s, size, cap,
                                check(d / FILE, sha), verified, rep))  # fmt: skip
                shutil.rmtree(d)
                print(runs[-1], flush=True)
            for spec in filter(None, a.official.split(",")):
                workers, part_mb = (int(x) for x in spec.split(":"))
                d, cache = fresh(f"official-{spec}"), fresh(f"cache-{spec}")
                s = run_official(url, d, workers, part_mb, cache)
                runs.append(Run("modelscope download --include", workers,
                                f"PARALLEL_WORKERS={workers} PART_SIZE_MB={part_mb}", s, size, cap,
                                check(d / FILE, sha), None, rep))  # fmt: skip
                shutil.rmtree(d)
                shutil.rmtree(cache, ignore_errors=True)
                print(runs[-1], flush=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)

    print()
    print(f"file {size / 1e9:.2f} GB random in {a.work}, per-connection cap {a.cap_mbps:g} MB/s, "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print("| tool | connections | settings | runs | median seconds (process start to verified file) | MB/s "
          "| share of link limit | sha256 ok |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for r in _medians(runs):
        extra = ""
        if r.verified_s:
            extra = (
                f" (last byte hashed at {r.verified_s:.1f} s: {r.size / r.verified_s / 1e6:.0f} MB/s, "
                f"{r.size / r.verified_s / (r.connections * r.cap_bps):.0%})"
            )
        print(f"| {r.tool} | {r.connections} | {r.settings} | {r.repetition} | {r.seconds:.1f} | {r.mbps:.0f} | "
              f"{r.share:.0%} of {r.connections}x{a.cap_mbps:g}{extra} | {'yes' if r.ok else 'NO'} |")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps([{**r.__dict__, "mbps": r.mbps, "share": r.share} for r in runs], indent=1))
    return 0 if all(r.ok for r in runs) else 1


if __name__ == "__main__":
    sys.exit(main())
