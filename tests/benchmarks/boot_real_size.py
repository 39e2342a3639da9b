"""A real-size boot, step by step: one fake instance (tests/rehearsal) boots the 16.8 GB planning-size model from the
S3 cache stand-in, and each step's time is printed beside the cold-start model's figure for that step at this
machine's rates (tests/benchmarks/cold_start_model.py, `steps`).

The model is the 27B stand-in (tests/catalog/stand_in.py): the tiny Qwen3.6-architecture GGUF extended with zeros to
the catalog's planning size, a sparse file. Real bytes where they matter: all 16.8 GB cross the network (the S3
stand-in, tests/rehearsal/objectstore.py, capped at --link-mbps with --stream-mbps per GET, behind the instance's
forwarder), are hashed and are written to this machine's disk by the real fetcher in the real image; the model's
load is the tiny model's, so the real-size read of the weights from the page cache is timed on its own inside the
instance (what a real model's load reads).

This machine's rates are measured first: sha256 on one core, writes to the disk the instance writes to (2 GiB,
fdatasync), reads back from the page cache, gzip decompression of the image's layers (the pull's CPU bound). Then,
so that this machine's memory is an instance's: its page cache is emptied (an instance's holds nothing else at
launch) and DAMON's proactive reclaim, where its kernel runs one, is paused for the boot (`--keep-caches`,
`--keep-damon` leave them). While the boot runs, the share of the instance's weights in the page cache is sampled
every second: the load's model maps what was held when llama-server began (at the rate measured inside the
instance, MAP_POPULATE as llama.cpp maps it) and reads the rest from the disk.

    GGUF_SERVE_REHEARSAL_IMAGE=<image> .venv/bin/python tests/benchmarks/boot_real_size.py --link-mbps 300

Needs root, the Docker engine, the serving image (built like the rehearsal builds it when absent) and about 20 GB
of free disk for the instance's copy. Not a test: it prints numbers (docs/cold-start.md quotes them).
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import hashlib
import os
import platform
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "benchmarks"))

from cold_start_model import Rates, steps  # noqa: E402

from gguf_serve.container import names  # noqa: E402

MIB = 1024 * 1024
MODEL_DIR = names.HOST_MODEL_DIR  # where the user data has the fetcher write the model
EVICT = """import os, sys
for top in sys.argv[1:]:
    for d, _, files in os.walk(top):
        for f in files:
            p = os.path.join(d, f)
            if os.path.isfile(p) and not os.path.islink(p):
                fd = os.open(p, os.O_RDONLY)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                os.close(fd)
"""


def measure_rates(work: Path, link_bps: float, stream_bps: float, streams: int, blobs: list[Path]) -> Rates:
    buf = os.urandom(256 * MIB)
    t0 = time.perf_counter()
    for _ in range(2):
        hashlib.sha256(buf).digest()
    hash_bps = 2 * len(buf) / (time.perf_counter() - t0)
    probe = work / "disk-probe"
    t0 = time.perf_counter()
    with probe.open("wb") as f:
        for _ in range(8):
            f.write(buf)
        f.flush()
        os.fdatasync(f.fileno())
    disk_bps = 8 * len(buf) / (time.perf_counter() - t0)
    cache_bps = _read_bps(probe)
    with probe.open("rb") as f:  # written back above: the page cache lets it go, the next read is the disk's
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
    disk_read_bps = _read_bps(probe)
    probe.unlink()
    t0, packed = time.perf_counter(), 0
    for blob in blobs:
        if blob.name.endswith(".tar.gz"):
            packed += blob.stat().st_size
            with gzip.open(blob) as g:
                while g.read(16 * MIB):
                    pass
    image_bps = packed / (time.perf_counter() - t0) if packed else float("inf")
    meminfo = _meminfo()
    available = int(meminfo["MemAvailable"].split()[0]) * 1024
    dirty_ratio = int(Path("/proc/sys/vm/dirty_ratio").read_text())
    return Rates(
        network_bps=min(link_bps, stream_bps * streams),
        hash_bps=hash_bps,
        disk_bps=disk_bps,
        page_cache_bps=cache_bps,
        dirty_limit=available * dirty_ratio / 100,
        image_bps=image_bps,
        disk_read_bps=disk_read_bps,
    )


class HostSampler:
    """This machine every `every` seconds while the boot runs: CPU busy (share of all cores), bytes written to its
    disks, dirty and writeback page-cache bytes, and how much of each watched file (the instance's copy of the
    weights once it exists, the S3 stand-in's source) the page cache holds. What a step was bound by, beside the
    model's reading of it."""

    def __init__(self, watched: dict[str, Callable[[], Path | None]], every: float = 1.0) -> None:
        self.every, self.samples = every, []  # (time, busy share, disk bytes written so far, dirty + writeback)
        self.watched = watched
        self.resident: dict[str, list[tuple[float, float]]] = {name: [] for name in watched}  # (time, share)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> HostSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = _cpu_times()
        while not self._stop.wait(self.every):
            now = _cpu_times()
            total, idle = now[0] - last[0], now[1] - last[1]
            last = now
            meminfo = {k: int(v.split()[0]) * 1024 for k, v in _meminfo().items() if k in ("Dirty", "Writeback")}
            self.samples.append(
                (time.time(), 1 - idle / total if total else 0.0, _disk_written(), sum(meminfo.values()))
            )
            for name, where in self.watched.items():
                path = where()
                if path is not None and (share := _resident_share(path)) is not None:
                    self.resident[name].append((time.time(), share))

    def between(self, start: float, end: float) -> str:
        inside = [x for x in self.samples if start <= x[0] <= end]
        if len(inside) < 2:
            return "too short to sample"
        busy = sum(x[1] for x in inside) / len(inside)
        written = (inside[-1][2] - inside[0][2]) / (inside[-1][0] - inside[0][0])
        return (f"CPU busy {busy:.0%} of {os.cpu_count()} cores, disk writes {written / 1e6:.0f} MB/s, "
                f"dirty + writeback up to {max(x[3] for x in inside) / 1e9:.1f} GB")  # fmt: skip

    def resident_at(self, name: str, when: float) -> float:
        """A watched file's share in the page cache at the last sample before `when` (nan: none)."""
        before = [share for t, share in self.resident[name] if t <= when]
        return before[-1] if before else float("nan")

    def most_resident(self, name: str, start: float, end: float) -> float:
        """A watched file's largest share in the page cache between two times (nan: no sample)."""
        return max((share for t, share in self.resident[name] if start <= t <= end), default=float("nan"))


def _cpu_times() -> tuple[int, int]:
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields), fields[3] + fields[4]  # idle + iowait


def _meminfo() -> dict[str, str]:
    return dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())


def _disk_written() -> int:
    """Bytes written to whole disks (not partitions) since boot."""
    total = 0
    for line in Path("/proc/diskstats").read_text().splitlines():
        f = line.split()
        if re.fullmatch(r"(vd|sd|xvd)[a-z]+|nvme\d+n\d+", f[2]):
            total += int(f[9]) * 512
    return total


def _resident_share(path: Path) -> float | None:
    """Of a file, the share the page cache holds (fincore: resident bytes / size); None while it is not there."""
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES,SIZE", str(path)],
                         capture_output=True, text=True, check=False).stdout.split()  # fmt: skip
    return int(out[0]) / int(out[1]) if len(out) == 2 and out[1].isdigit() and int(out[1]) else None


DAMON = Path("/sys/kernel/mm/damon/admin/kdamonds")


@contextlib.contextmanager
def _no_proactive_reclaim() -> Iterator[list[str]]:
    """Pause DAMON's running kdamonds for the boot, and restart them after: a VM host may run one to page out what
    was not touched for a while (here: `pageout` of regions idle for 12 x 5 s, up to 128 MiB/s), which takes the
    weights written first out of the page cache before the load. A kernel starts none of its own accord: the
    sysfs kdamonds run once written `on`, and DAMON_RECLAIM's `enabled` defaults to N (mm/damon/reclaim.c,
    Documentation/admin-guide/mm/damon/reclaim.rst); whether an instance's AMI turns one on is not checked here.
    Yields the kdamonds paused."""
    paused = [d.name for d in sorted(DAMON.glob("[0-9]*")) if (d / "state").read_text().strip() == "on"]
    for name in paused:
        (DAMON / name / "state").write_text("off\n")
    try:
        yield paused
    finally:
        for name in paused:
            (DAMON / name / "state").write_text("on\n")


def _drop_caches() -> None:
    """Empty this machine's page cache, as an instance's is at launch: what else it held (images, test data, other
    work) would otherwise stay while the fetched weights, written last, are reclaimed first."""
    subprocess.run(["sync"], check=True)
    Path("/proc/sys/vm/drop_caches").write_text("1\n")


def _read_bps(path: Path) -> float:
    """Bytes per second `cat` reads the file at: the tool the instance's read of the weights is timed with."""
    t0 = time.perf_counter()
    subprocess.run(["cat", str(path)], stdout=subprocess.DEVNULL, check=True)
    return path.stat().st_size / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--link-mbps", type=float, default=300.0, help="the S3 stand-in, all GETs together (MB/s)")
    ap.add_argument("--stream-mbps", type=float, default=40.0, help="each GET (MB/s)")
    ap.add_argument(
        "--keep",
        action="store_true",
        help="keep the instance until Enter is pressed (its serving units stopped by the second pull)",
    )
    ap.add_argument("--server-log", action="store_true", help="print the units' journal from the server's start on")
    ap.add_argument(
        "--keep-damon",
        action="store_true",
        help="leave DAMON's proactive reclaim running during the boot, where this machine runs it (default: paused)",
    )
    ap.add_argument(
        "--keep-caches",
        action="store_true",
        help="leave this machine's page cache as it is before the boot (default: emptied, as an instance's at launch)",
    )
    a = ap.parse_args()

    from gguf_serve.catalog.models import ModelArtifact
    from tests.catalog.stand_in import FILE, REPO, stand_in_gguf
    from tests.committed import local_profile
    from tests.rehearsal.conftest import _stage_and_synth
    from tests.rehearsal.harness import STATE, rehearsal_profile

    image = os.environ.get("GGUF_SERVE_REHEARSAL_IMAGE") or _serving_image(_stage_and_synth())
    gguf = stand_in_gguf()
    sha = gguf.with_name(gguf.name + ".sha256").read_text().split()[0]
    artifact = ModelArtifact(
        name="qwen36-27b-stand-in", repo=REPO, file=FILE, size_bytes=gguf.stat().st_size, sha256=sha,
        gguf_architecture="qwen35", has_mtp_layers=True, total_params_b=0.0003, active_params_b=0.0003,
        kv_bytes_per_token=4096,
    )  # fmt: skip
    base = rehearsal_profile()
    profile = replace(base, model=artifact, server=local_profile(model=artifact).server)
    profile = replace(profile, server=replace(profile.server, host=base.server.host, port=base.server.port))
    STATE.mkdir(parents=True, exist_ok=True)
    print(f"boot of {artifact.size_bytes / 1e9:.1f} GB from the S3 stand-in at {a.link_mbps:g} MB/s "
          f"({a.stream_mbps:g} MB/s per GET) with image {image}", flush=True)  # fmt: skip
    with contextlib.ExitStack() as stack:
        paused = [] if a.keep_damon else stack.enter_context(_no_proactive_reclaim())
        if paused:
            print(f"DAMON's proactive reclaim paused for the boot (kdamond {', '.join(paused)})", flush=True)
        return _boot(a, image, gguf, artifact, profile)


def _boot(a, image, gguf, artifact, profile) -> int:  # noqa: ANN001 - the parsed arguments and the boot's inputs
    from tests.catalog.stand_in import FILE
    from tests.rehearsal.harness import STATE, World

    streams = 16  # the fetcher's default --s3-connections
    with World(image, gguf, profile=profile) as world:
        blobs = list(world.registry.blobs.values())
        rates = measure_rates(STATE, a.link_mbps * 1e6, a.stream_mbps * 1e6, streams, blobs)
        world.aws.objects.limit(link_bps=a.link_mbps * 1e6, connection_bps=a.stream_mbps * 1e6)
        world.seed_cache(gguf, artifact.sha256)
        instance = world.instance("i-0b00000000000b16e")
        if not a.keep_caches:
            _drop_caches()
        watched = {"weights": lambda: _host_path(instance, FILE), "source": lambda: gguf}
        with HostSampler(watched) as sampler:
            instance.start()
            result = instance.wait_boot_done(timeout=3600)
        at = {t.step.split(" ")[0]: t.at for t in instance.step_times()}
        at["first-200"] = _first_healthy(instance)
        at |= _server_load(instance)
        if a.server_log:
            _print_server_start(instance, at)
        fetch_line = _fetch_line(world)
        pull_fixed_s = _pull_again(instance, removed=False)
        cached_share = _cached_share(instance, FILE)
        read_s = _page_cache_read(instance, FILE)
        again = (_cached_share(instance, FILE), _page_cache_read(instance, FILE))  # what the first read left cached
        map_bps = _map_bps(instance, FILE)
        pull_s = _pull_again(instance, removed=True)
        if a.keep:
            input("press Enter to tear the instance down")
    print(result)
    t = instance.started_at
    print(f"during the image pull: {sampler.between(t + at.get('image', 0), t + at.get('model', 0))}")
    print(f"during the model fetch: {sampler.between(t + at.get('model', 0), t + at.get('systemd', 0))}")
    print(f"the weights read again at once: {again[1]:.1f} s, {again[0]:.0%} of them in the page cache before it")
    t_load = t + at.get("loading", float("nan"))
    at_load = sampler.resident_at("weights", t_load)
    fetch_end = t + at.get("systemd", float("nan"))
    source = sampler.most_resident("source", t + at.get("model", 0), fetch_end) * artifact.size_bytes
    print(f"the S3 stand-in's source in this machine's page cache during the fetch: up to {source / 1e9:.1f} GB")
    print(f"of the weights in the page cache: {at_load:.0%} when llama-server began loading, {cached_share:.0%} "
          "after the boot; "
          f"mapped from the page cache (MAP_POPULATE, as llama.cpp maps it) at {map_bps / 1e9:.1f} GB/s")  # fmt: skip
    measured = _measured(at, fetch_line, read_s)
    compressed = world.registry.compressed_bytes
    print(f"the image pulled again inside the instance, its layers removed first: {pull_s:.1f} s; the login and a "
          f"pull of the image present: {pull_fixed_s:.1f} s; gzip alone: "
          f"{compressed / rates.image_bps:.1f} s")  # fmt: skip
    pull_bps = compressed / (pull_s - pull_fixed_s) if pull_s > pull_fixed_s else rates.image_bps
    rates = replace(rates, image_fixed_s=pull_fixed_s, cached_share=cached_share, image_bps=pull_bps)
    model = steps(artifact.size_bytes, world.registry.compressed_bytes, rates)
    # The stand-in's tensors are tiny: its load maps what the page cache held when it began and reads the rest.
    load = steps(artifact.size_bytes, compressed, replace(rates, cached_share=at_load, map_bps=map_bps))
    model["load (llama-server maps the weights)"] = load["load (llama-server maps the weights)"]
    _print(measured, model, rates, world.registry.compressed_bytes, artifact.size_bytes, a)
    return 0 if result.endswith("exited 0") else 1


def _serving_image(assembly: Path) -> str:
    from tests.images.buildspec import build_inputs, run_buildspec
    from tests.images.engine import docker, ensure_engine

    ensure_engine()
    inputs = build_inputs(assembly, "IntelMoeStack")
    if docker("image", "inspect", inputs.image, check=False).returncode != 0:
        work = Path(os.environ.get("TMPDIR", "/tmp")) / "gguf-serve-rehearsal-build"
        work.mkdir(parents=True, exist_ok=True)
        run_buildspec(inputs, work)
    return inputs.image


def _fetch_line(world) -> str:  # noqa: ANN001 - tests.rehearsal.harness.World
    """The launcher's `model ready at ... (figures)` line from the fetch container's CloudWatch Logs stream."""
    logs = world.aws.client("logs")
    events = logs.get_log_events(logGroupName=world.boot.log_group, logStreamName="ip-10-0-1-23/fetch")["events"]
    return next((e["message"] for e in reversed(events) if "model ready at" in e["message"]), "")


def _pull_again(instance, *, removed: bool) -> float:  # noqa: ANN001 - a FakeInstance
    """Seconds of the boot script's ECR login and `docker pull`, run again inside the instance with the user data's
    environment, the AWS CLI's files evicted from the page cache first (at boot the login is the CLI's first start).
    With the image present, the pull is the registry's round trips only: the step's cost whatever the image's size.
    With `removed`, the serving units stop and the image goes first, so every layer is fetched, checked and unpacked
    again on this machine, with nothing else of the boot running beside it."""
    from tests.rehearsal.harness import REGION

    remove = (
        "systemctl stop 'gguf-serve-*' >/dev/null 2>&1; docker ps -aq | xargs -r docker rm -f >/dev/null; "
        'docker rmi -f "$image" >/dev/null; '
    )
    script = (
        f"python3 -c {shlex.quote(EVICT)} /opt/awscli /usr/lib/python3*; "
        "export $(systemctl show-environment | grep -E '^AWS_[A-Z_]+=') AWS_REGION=" + REGION + "; "
        'image=$(journalctl -t gguf-serve-boot -o cat --no-pager | sed -n "s/^gguf-serve-boot: image //p" | head -1); '
        + (remove if removed else "")
        + "s=$(date +%s%N); "
        'aws ecr get-login-password --region "$AWS_REGION" | docker login --username AWS --password-stdin '
        '"${image%%/*}" >/dev/null && docker pull -q "$image" >/dev/null && e=$(date +%s%N) && '
        "echo $(((e - s) / 1000000))"
    )
    out = instance.sh(script, timeout=600)
    if not out.stdout.strip().isdigit():
        print(f"the pull was not timed: {out.stdout[-300:]} {out.stderr[-500:]}", flush=True)
        return float("nan")
    return int(out.stdout.strip()) / 1000


def _print_server_start(instance, at: dict[str, float]) -> None:  # noqa: ANN001 - a FakeInstance
    """The journal of the serving units between their start and the first /health 200, in seconds since the start."""
    from gguf_serve.container.names import HOP_UNIT, READY_UNIT, SERVER_UNIT

    units = " ".join(f"-u {u}" for u in (SERVER_UNIT, HOP_UNIT, READY_UNIT, "docker"))
    out = instance.sh(f"journalctl {units} -o short-unix --no-pager").stdout
    for line in out.splitlines():
        stamp, _, rest = line.partition(" ")
        t = float(stamp) - instance.started_at if re.fullmatch(r"[\d.]+", stamp) else -1.0
        if at["systemd"] - 1 <= t <= at["first-200"] + 1:
            print(f"{t:7.2f} {rest[:150]}")


def _server_load(instance) -> dict[str, float]:  # noqa: ANN001 - a FakeInstance
    """When llama-server began loading the weights and when it had them (its own log lines, through the journal)."""
    from gguf_serve.container.names import SERVER_UNIT

    out = instance.sh(f"journalctl -u {SERVER_UNIT} -o short-unix --no-pager").stdout
    found: dict[str, float] = {}
    for line in out.splitlines():
        stamp = line.split(" ", 1)[0]
        for key, text in (("loading", "load_model: loading model"), ("loaded", "llama_server: model loaded")):
            if text in line and key not in found and re.fullmatch(r"[\d.]+", stamp):
                found[key] = float(stamp) - instance.started_at
    return found


def _first_healthy(instance) -> float:  # noqa: ANN001 - a FakeInstance
    """When the readiness unit saw the first /health 200, in seconds since the instance started."""
    from gguf_serve.container.names import READY_UNIT

    out = instance.sh(f"journalctl -u {READY_UNIT} -o short-unix --no-pager | grep -m1 ': healthy$'").stdout
    stamp = out.split(" ", 1)[0]
    return float(stamp) - instance.started_at if re.fullmatch(r"[\d.]+", stamp) else float("nan")


def _cached_share(instance, file: str) -> float:  # noqa: ANN001 - a FakeInstance
    """Of the instance's model file, the share the page cache holds now (nan: no file)."""
    path = _host_path(instance, file)
    share = _resident_share(path) if path is not None else None
    return float("nan") if share is None else share


def _host_path(instance, file: str) -> Path | None:  # noqa: ANN001 - a FakeInstance
    """The instance's copy of the model file as this machine sees it (its container's upper layer), once it exists."""
    from tests.images.engine import docker

    upper = docker("inspect", "-f", "{{.GraphDriver.Data.UpperDir}}", instance.name, check=False).stdout.strip()
    path = Path(upper) / MODEL_DIR.lstrip("/") / file if upper else None
    return path if path is not None and path.is_file() else None


MAP = """import mmap, os, sys, time
fd = os.open(sys.argv[1], os.O_RDONLY)
t = time.perf_counter()
m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0x8000), prot=mmap.PROT_READ)
print(int(os.fstat(fd).st_size / (time.perf_counter() - t)))
"""


def _map_bps(instance, file: str) -> float:  # noqa: ANN001 - a FakeInstance
    """Bytes per second the page cache's copy of the weights is mapped at inside the instance, as llama.cpp's loader
    maps it (mmap with MAP_POPULATE: every page entered in the process's page tables, nothing copied)."""
    out = instance.sh(f"python3 -c {shlex.quote(MAP)} {MODEL_DIR}/{file}", timeout=600).stdout.strip()
    return float(out) if out.isdigit() else float("nan")


def _page_cache_read(instance, file: str) -> float:  # noqa: ANN001 - a FakeInstance
    """Seconds to read the whole model back inside the instance (the page cache, or the disk where it was evicted)."""
    script = f"s=$(date +%s%N); cat {MODEL_DIR}/{file} > /dev/null; e=$(date +%s%N); echo $(((e - s) / 1000000))"
    out = instance.sh(script, timeout=1800).stdout
    return int(out.strip()) / 1000 if out.strip().isdigit() else float("nan")


def _measured(at: dict[str, float], fetch_line: str, read_s: float) -> dict[str, float]:
    nan = float("nan")
    m = re.search(r"in ([\d.]+) s: last byte at ([\d.]+) s, hashed at ([\d.]+) s, on disk at ([\d.]+) s", fetch_line)
    total, received, hashed, on_disk = (float(x) for x in m.groups()) if m else (float("nan"),) * 4
    return {
        "image pull": at.get("model", float("nan")) - at.get("image", float("nan")),
        "fetch (network)": received,
        "verify (hash after the last byte)": hashed - received,
        "write (fsync after the hash)": on_disk - hashed,
        "fetch step in all": at.get("systemd", float("nan")) - at.get("model", float("nan")),
        "server start to first /health 200 (stand-in weights)": at.get("first-200", nan) - at.get("systemd", nan),
        "load (llama-server maps the weights)": at.get("loaded", nan) - at.get("loading", nan),
        "after it: the lifecycle hook and CloudFormation's signal": at.get("healthy;", nan) - at.get("first-200", nan),
        "real-size read of the weights": read_s,
        "boot (start to healthy)": at.get("healthy;", float("nan")),
    }  # fmt: skip


def _print(measured: dict[str, float], model: dict[str, float], rates: Rates, image: int, size: int, a) -> None:  # noqa: ANN001
    print(f"\nreal-size boot: {size / 1e9:.1f} GB model, image {image / 1e6:.0f} MB compressed; {os.cpu_count()} CPUs "
          f"({platform.machine()}), load average {os.getloadavg()[0]:.1f} at the end")  # fmt: skip
    print(f"this machine's rates: network {rates.network_bps / 1e6:.0f} MB/s (S3 stand-in: {a.link_mbps:g} MB/s link, "
          f"{a.stream_mbps:g} MB/s per GET x 16), sha256 {rates.hash_bps / 1e6:.0f} MB/s, disk writes "
          f"{rates.disk_bps / 1e6:.0f} MB/s, page-cache reads {rates.page_cache_bps / 1e6:.0f} MB/s, dirty limit "
          f"{rates.dirty_limit / 1e9:.1f} GB, image layers pulled at {rates.image_bps / 1e6:.0f} MB/s; disk reads "
          f"{rates.disk_read_bps / 1e6:.0f} MB/s; the image's ECR login and a pull of it again "
          f"{rates.image_fixed_s:.1f} s; of the weights, {rates.cached_share:.0%} in the page cache before the "
          "read")  # fmt: skip
    print("| step | measured s | model s at this machine's rates | measured / model |")
    print("|---|---|---|---|")
    for step, value in measured.items():
        expect = model.get(step)
        ratio = f"{value / expect:.2f}" if expect else "-"
        print(f"| {step} | {value:.1f} | {f'{expect:.1f}' if expect is not None else '-'} | {ratio} |")


if __name__ == "__main__":
    sys.exit(main())
