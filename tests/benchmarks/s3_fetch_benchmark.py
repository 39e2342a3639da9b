"""S3-cache download benchmark: gguf-serve-fetch reading the model cache vs boto3's own parallel download (s3transfer,
what `aws s3 cp` runs), from an S3 stand-in on loopback with its own rate limit.

The stand-in (tests/rehearsal/objectstore.py) answers HEAD and ranged GET with If-Match the way S3 does, from a file
of random bytes; it caps each GET stream at --stream-mbps and all of them together at --link-mbps (the instance's
network). Each tool downloads the object to a fresh directory and verifies sha256 (gguf-serve-fetch while streaming,
against the pin, as an instance does; boto3 afterwards, as a script would); the script prints MB/s and the share of
the link. The time is the tool's whole run: process start to a verified file.

    .venv/bin/python tests/benchmarks/s3_fetch_benchmark.py --size-gib 3 --link-mbps 400 --stream-mbps 40

Not a test: it prints numbers (docs/cold-start.md quotes them).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from fetch_benchmark import FILE, REPO, _filesystem, check, default_work, make_file  # noqa: E402

from tests.rehearsal.objectstore import ObjectFiles, serve  # noqa: E402

BUCKET, PREFIX, REVISION = "gguf-serve-bench-cache", "models", "master"


def aws_env(url: str) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "bench",
            "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "cn-northwest-1"}  # fmt: skip


def run_fetch(url: str, dest: Path, sha: str, size: int, connections: int, part_mib: int) -> tuple[float, dict]:
    t0 = time.monotonic()
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.fetch", "--repo", REPO, "--file", FILE, "--sha256", sha,
         "--size", str(size), "--dest", str(dest), "--s3-cache", f"s3://{BUCKET}/{PREFIX}", "--no-upload",
         "--endpoint", "http://127.0.0.1:9", "--s3-connections", str(connections), "--part-size-mib", str(part_mib),
         "--quiet"],
        cwd=ROOT, check=True, stdout=subprocess.PIPE, text=True, env=aws_env(url),
    )  # fmt: skip
    return time.monotonic() - t0, json.loads(out.stdout)


BOTO3_DOWNLOAD = """
import hashlib, sys, boto3
from boto3.s3.transfer import TransferConfig
bucket, key, dest, sha, n, chunk = sys.argv[1:7]
boto3.client("s3").download_file(bucket, key, dest, Config=TransferConfig(max_concurrency=int(n),
    multipart_chunksize=int(chunk), multipart_threshold=int(chunk)))
h = hashlib.sha256()
with open(dest, "rb") as f:
    while block := f.read(8 << 20):
        h.update(block)
sys.exit(0 if h.hexdigest() == sha else 3)
"""


def run_boto3(url: str, dest: Path, sha: str, key: str, connections: int, part_mib: int) -> float:
    dest.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    subprocess.run(
        [sys.executable, "-c", BOTO3_DOWNLOAD, BUCKET, key, str(dest / FILE), sha, str(connections),
         str(part_mib << 20)],
        check=True, env=aws_env(url),
    )  # fmt: skip
    return time.monotonic() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gib", type=float, default=3.0)
    ap.add_argument("--link-mbps", type=float, default=400.0, help="all GETs together, MB/s (10^6 bytes)")
    ap.add_argument("--stream-mbps", type=float, default=40.0, help="each GET, MB/s")
    ap.add_argument("--connections", type=int, nargs="+", default=[16])
    ap.add_argument("--part-mib", type=int, default=16)
    ap.add_argument(
        "--boto3", type=int, nargs="*", default=[16], help="boto3 download_file runs at these concurrencies"
    )
    ap.add_argument("--work", type=Path, default=default_work())
    ap.add_argument("--repeat", type=int, default=1)
    a = ap.parse_args()
    logging.getLogger("werkzeug").setLevel(logging.WARNING)

    size = int(a.size_gib * 1024**3)
    source = a.work / "hub" / REPO / FILE
    print(f"preparing {size / 1e9:.2f} GB of random bytes in {source.parent} ...", flush=True)
    sha = make_file(source, size)
    store = ObjectFiles(link_bps=a.link_mbps * 1e6, connection_bps=a.stream_mbps * 1e6)
    key = f"{PREFIX}/{REPO}/{REVISION}/{FILE}"
    store.put(BUCKET, key, source, {"sha256": sha})
    server = serve(store)
    link = a.link_mbps * 1e6
    rows: list[tuple[str, int, float, bool, float | None]] = []
    try:
        for _ in range(a.repeat):
            for n in a.connections:
                d = a.work / "out" / f"s3-{n}"
                shutil.rmtree(d, ignore_errors=True)
                seconds, result = run_fetch(server.url, d, sha, size, n, a.part_mib)
                assert result["source"] == "s3", result
                rows.append(
                    ("gguf-serve-fetch --s3-cache", n, seconds, check(d / FILE, sha), result["verified_seconds"])
                )
                shutil.rmtree(d)
                print(rows[-1], flush=True)
            for n in a.boto3:
                d = a.work / "out" / f"boto3-{n}"
                shutil.rmtree(d, ignore_errors=True)
                seconds = run_boto3(server.url, d, sha, key, n, a.part_mib)
                rows.append(("boto3 download_file + sha256", n, seconds, check(d / FILE, sha), None))
                shutil.rmtree(d)
                print(rows[-1], flush=True)
    finally:
        server.close()
    c = store.counters
    print()
    print(f"object {size / 1e9:.2f} GB random in {a.work} ({_filesystem(a.work)}), S3 stand-in on loopback: "
          f"{a.stream_mbps:g} MB/s per GET, link {a.link_mbps:g} MB/s; {c.gets} GETs, {c.heads} HEADs; "
          f"{os.cpu_count()} CPUs, {platform.machine()}, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print("| tool | connections | seconds (process start to verified file) | MB/s | share of the reachable rate "
          "(the link, or connections x the per-GET cap when lower) | sha256 ok |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for tool, n, seconds, ok, verified in rows:
        reach = min(link, n * a.stream_mbps * 1e6)
        of = "the link" if reach == link else f"{n}x{a.stream_mbps:g}"
        extra = f" (last byte hashed at {verified:.1f} s: {size / verified / reach:.1%})" if verified else ""
        print(
            f"| {tool} | {n} | {seconds:.1f} | {size / seconds / 1e6:.0f} | {size / seconds / reach:.1%} of {of}"
            f"{extra} | {'yes' if ok else 'NO'} |"
        )
    return 0 if all(r[3] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
