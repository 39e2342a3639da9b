"""Download benchmark: gguf-serve-fetch vs a single stream vs the official `modelscope download`, over a capped link.

A random file (hashing is real work) is served the way ModelScope serves it: the API answers each download with a
302 to a signed URL on a storage host (a second local hub), and the storage host caps every connection at
--cap-mbps and cuts one download in every --reset-every mid-body (a TCP reset, as a middlebox does). Each tool
downloads the file to a fresh directory; the script prints MB/s, the share of the link (connections x cap) each
reached, and gguf-serve-fetch's speed over the official CLI's best run. Every tool verifies sha256:
gguf-serve-fetch while streaming, `modelscope download --include` after the download, the single stream while
streaming. The time is the tool's whole run: process start to a verified file under its final name.

The file and the downloads live on tmpfs (/dev/shm) when it has room: this measures the network and the hash, not
this machine's shared disk (the boot rehearsal measures the write; docs/cold-start.md).

    .venv/bin/python tests/benchmarks/fetch_benchmark.py --size-gib 3 --cap-mbps 25 --connections 8 16

Not a test: it takes a few minutes and prints numbers (docs/cold-start.md quotes them).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import platform
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
from gguf_serve.local.hub import Faults, LocalScope  # noqa: E402

REPO = "gguf-serve-bench/random-GGUF"
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


def start_hubs(root: Path, cap_mbps: float, reset_every: int) -> tuple[LocalScope, LocalScope]:
    """(api, storage): the API redirects every download to the storage host, which caps and cuts connections.
    Both run in this process; it only waits for the tools' processes meanwhile."""
    storage = LocalScope(root, faults=Faults(bandwidth_bps=cap_mbps * 1e6, reset_every=reset_every)).start()
    api = LocalScope(root, faults=Faults(redirect_to=storage.url.replace("127.0.0.1", "localhost"))).start()
    return api, storage


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


def default_work() -> Path:
    """tmpfs when it has room for the file and two copies, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and shutil.disk_usage(shm).free > 12 * 1024**3:
        return shm / "gguf-serve-fetch-bench"
    return Path(tempfile.gettempdir()) / "gguf-serve-fetch-bench"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=3.0)
    ap.add_argument("--cap-mbps", type=float, default=25.0, help="per-connection cap, MB/s (10^6 bytes)")
    ap.add_argument("--reset-every", type=int, default=40, help="the storage host cuts every Nth download (0: never)")
    ap.add_argument("--work", type=Path, default=default_work(), help="where the file and the downloads go")
    ap.add_argument("--connections", type=int, nargs="+", default=[8, 16])
    ap.add_argument("--part-mib", type=int, default=16, help="gguf-serve-fetch part size")
    ap.add_argument("--official", default="8:32,16:32", help="official CLI runs, workers:part_mb,...")
    ap.add_argument("--single", action="store_true", help="also one plain HTTP stream (no cuts: it cannot resume)")
    ap.add_argument("--repeat", type=int, default=1, help="runs per setting; the table shows the median")
    ap.add_argument("--json", type=Path, help="also write the results here")
    a = ap.parse_args()

    size = int(a.size_gib * 1024**3)
    root = a.work / "hub"
    print(f"preparing {size / 1e9:.2f} GB of random bytes in {root} ...", flush=True)
    sha = make_file(root / REPO / FILE, size)
    api, storage = start_hubs(root, a.cap_mbps, a.reset_every)
    url = api.url
    cap = a.cap_mbps * 1e6
    runs: list[Run] = []
    cuts: dict[str, int] = {}

    def fresh(name: str) -> Path:
        d = a.work / "out" / name
        shutil.rmtree(d, ignore_errors=True)
        return d

    def cut_count() -> int:
        return sum(1 for r in storage.stats.downloads() if r.get("injected") == "reset")

    try:
        if a.single:
            storage.faults.reset_every = 0
            d = fresh("single")
            s = run_single_stream(url, d, sha)
            runs.append(Run("single stream (urllib, sha256 while streaming)", 1, "-", s, size, cap, True))
            shutil.rmtree(d)
            storage.faults.reset_every = a.reset_every
            print(runs[-1], flush=True)
        for rep in range(1, a.repeat + 1):  # interleaved, so a busy moment on the machine hits every tool alike
            for n in a.connections:
                d, before = fresh(f"fetch-{n}"), cut_count()
                s, verified = run_modelfetch(url, d, sha, size, n, a.part_mib)
                runs.append(Run("gguf-serve-fetch", n, f"--connections {n} --part-size-mib {a.part_mib}", s, size,
                                cap, check(d / FILE, sha), verified, rep))  # fmt: skip
                cuts[f"gguf-serve-fetch {n}"] = cuts.get(f"gguf-serve-fetch {n}", 0) + cut_count() - before
                shutil.rmtree(d)
                print(runs[-1], flush=True)
            for spec in filter(None, a.official.split(",")):
                workers, part_mb = (int(x) for x in spec.split(":"))
                d, cache, before = fresh(f"official-{spec}"), fresh(f"cache-{spec}"), cut_count()
                s = run_official(url, d, workers, part_mb, cache)
                runs.append(Run("modelscope download --include", workers,
                                f"PARALLEL_WORKERS={workers} PART_SIZE_MB={part_mb}", s, size, cap,
                                check(d / FILE, sha), None, rep))  # fmt: skip
                cuts[f"official {spec}"] = cuts.get(f"official {spec}", 0) + cut_count() - before
                shutil.rmtree(d)
                shutil.rmtree(cache, ignore_errors=True)
                print(runs[-1], flush=True)
    finally:
        api.stop()
        storage.stop()

    redirects = sum(1 for r in api.stats.requests if r["kind"] == "redirect")
    print()
    print(f"file {size / 1e9:.2f} GB random in {a.work} ({_filesystem(a.work)}), every download a 302 to a storage "
          f"host ({redirects} redirects in all) capping each connection at {a.cap_mbps:g} MB/s and cutting every "
          f"{a.reset_every or 'no'}th download mid-body ({', '.join(f'{k}: {v}' for k, v in cuts.items())} cut); "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    medians = _medians(runs)
    best_official = min((r.seconds for r in medians if r.tool.startswith("modelscope")), default=None)
    print("| tool | connections | settings | runs | median seconds (process start to verified file) | MB/s "
          "| share of the link | vs the official CLI's best | sha256 ok |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for r in medians:
        extra = ""
        if r.verified_s:
            extra = (
                f" (last byte hashed at {r.verified_s:.1f} s: {r.size / r.verified_s / 1e6:.0f} MB/s, "
                f"{r.size / r.verified_s / (r.connections * r.cap_bps):.1%})"
            )
        versus = f"{best_official / r.seconds:.2f}x" if best_official else "-"
        ok = "yes" if r.ok else "NO"
        print(f"| {r.tool} | {r.connections} | {r.settings} | {r.repetition} | {r.seconds:.1f} | {r.mbps:.0f} | "
              f"{r.share:.1%} of {r.connections}x{a.cap_mbps:g}{extra} | {versus} | {ok} |")  # fmt: skip
    if a.json:
        a.json.write_text(json.dumps([{**r.__dict__, "mbps": r.mbps, "share": r.share} for r in runs], indent=1))
    return 0 if all(r.ok for r in runs) else 1


def _filesystem(path: Path) -> str:
    """The file system type holding `path` (tmpfs, ext4, ...), from /proc/mounts."""
    best, kind = "", "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            _, mount, fstype, *_ = line.split()
            if str(path.resolve()).startswith(mount) and len(mount) > len(best):
                best, kind = mount, fstype
    return kind


if __name__ == "__main__":
    sys.exit(main())
