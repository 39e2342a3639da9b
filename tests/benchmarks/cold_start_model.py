"""Cold-start model: how long each production profile takes from launch to /health 200, and what bounds it.

    .venv/bin/python tests/benchmarks/cold_start_model.py

Prints a markdown table (docs/model-delivery.md quotes it). Every input is listed in ASSUMPTIONS or read from
the catalog (model bytes, gp3 throughput); each carries where it comes from. It is arithmetic, not a measurement.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from gguf_serve.catalog import ServingProfile, load_catalog  # noqa: E402

MIB = 1024 * 1024
ECR_FIXED_S = 3.0
GBIT = 1e9 / 8  # bytes per second in one Gbit/s


@dataclass(frozen=True)
class InstanceIO:
    network_bps: float  # "up to" (burst) network bandwidth
    ebs_bps: float  # "up to" (burst) EBS bandwidth of the instance
    image_bytes: float  # container image pulled from ECR


# Sourced from the AWS instance-type pages, not verified here (no AWS account): burst ("up to") figures.
INSTANCES: dict[str, InstanceIO] = {
    "c8g.4xlarge": InstanceIO(network_bps=15 * GBIT, ebs_bps=10 * GBIT, image_bytes=0.3e9),
    "c8g.8xlarge": InstanceIO(network_bps=15 * GBIT, ebs_bps=10 * GBIT, image_bytes=0.3e9),
    "c8i.4xlarge": InstanceIO(network_bps=12.5 * GBIT, ebs_bps=10 * GBIT, image_bytes=0.3e9),
    "g5.xlarge": InstanceIO(network_bps=10 * GBIT, ebs_bps=3.5 * GBIT, image_bytes=3.0e9),
}

ASSUMPTIONS = {
    "boot_s": (45, "launch to user data running (assumed; AL2023 / DLAMI)"),
    "ecr_bps": (150 * MIB, "image pull incl. decompression from in-region ECR (assumed)"),
    "ecr_fixed_s": (
        ECR_FIXED_S,
        "the ECR login (the AWS CLI starting) and the registry's round trips before any "
        "layer (assumed; boot_real_size.py measures it in the rehearsal: docs/cold-start.md)",
    ),
    "modelscope_stream_bps": (15 * MIB, "one ModelScope stream (issue 3, findings.md)"),
    "modelscope_streams": (8, "modelfetch default --connections; assumes no per-client cap (open)"),
    "s3_stream_bps": (80 * MIB, "one in-region S3 GET stream (assumed; 80-100 MB/s per stream is typical)"),
    "s3_streams": (16, "modelfetch default --s3-connections"),
    "page_cache_bps": (4e9, "llama-server mapping weights already in the page cache (assumed)"),
    "hash_bps": (1.5e9, "sha256 on one core with SHA extensions (measured here: findings.md; boot_real_size.py)"),
    "dirty_share": (0.2, "vm.dirty_ratio: the share of RAM the page cache takes unwritten before writers wait"),
    "server_init_s": (5, "llama-server context, warm-up decode (assumed)"),
}


def a(name: str) -> float:
    return float(ASSUMPTIONS[name][0])


@dataclass(frozen=True)
class ColdStart:
    profile: str
    instance: str
    model_bytes: int
    gp3_bps: float
    disk_bps: float  # what the root volume can absorb: min(gp3 throughput, instance EBS bandwidth)
    disk_bound: str
    modelscope_s: float
    s3_s: float
    upload_s: float
    load_s: float
    load_from: str
    image_s: float

    @property
    def first_instance_s(self) -> float:  # ModelScope, then write-back to the cache before the server starts
        return a("boot_s") + self.image_s + self.modelscope_s + self.upload_s + self.load_s + a("server_init_s")

    @property
    def scale_out_s(self) -> float:  # every later instance: the in-region cache
        return a("boot_s") + self.image_s + self.s3_s + self.load_s + a("server_init_s")

    @property
    def warm_pool_s(self) -> float:  # stopped instance with the model on its volume: no image, no fetch
        ebs_load = self.model_bytes / self.disk_bps
        return a("boot_s") + ebs_load + a("server_init_s")


@dataclass(frozen=True)
class Rates:
    """What one machine does, bytes per second: the inputs of one boot's model steps."""

    network_bps: float  # the model's source as the instance reaches it (streams x per-stream rate, capped by the link)
    hash_bps: float  # sha256 on one core
    disk_bps: float  # sustained writes to the model's volume
    page_cache_bps: float  # reading the weights back from the page cache
    dirty_limit: float  # bytes the page cache takes unwritten before the writer is held to the disk's rate
    image_bps: float  # image pull: compressed bytes per second, decompression and extraction included
    image_fixed_s: float = 0.0  # image pull: the registry login and round trips, whatever the image's size
    disk_read_bps: float = 0.0  # reading the weights from the volume (what the page cache does not hold)
    cached_share: float = 1.0  # of the weights, what the page cache holds when the server starts reading them
    # Mapping weights the page cache holds without reading them (llama.cpp maps the file with MAP_POPULATE): the
    # load of a model whose tensors are a few megabytes (the rehearsal's stand-in). 0: the load reads the weights.
    map_bps: float = 0.0


def steps(size: int, image_bytes: int, r: Rates) -> dict[str, float]:
    """Seconds of each boot step for a model of `size` bytes. The fetcher writes into the page cache and hashes
    behind the download; the kernel writes back from the start, so the final fsync waits only for what the disk
    has not caught up with, and the download itself slows to the disk's rate once the dirty limit is reached.
    The load reads what the page cache still holds at its rate and the rest from the volume; with `map_bps` (a
    stand-in whose tensors are tiny) it maps what the page cache holds at that rate and reads the rest."""
    network = size / r.network_bps
    held = (size - r.dirty_limit) / r.disk_bps if size > r.dirty_limit else 0.0
    received = max(network, held)
    hashed = max(received, size / r.hash_bps)
    on_disk = max(hashed, size / r.disk_bps)
    cached = size * r.cached_share
    uncached = (size - cached) / r.disk_read_bps if cached < size else 0.0
    read = cached / r.page_cache_bps + uncached
    load = cached / r.map_bps + uncached if r.map_bps else read
    return {
        "image pull": r.image_fixed_s + image_bytes / r.image_bps,
        "fetch (network)": received,
        "verify (hash after the last byte)": hashed - received,
        "write (fsync after the hash)": on_disk - hashed,
        "fetch step in all": on_disk,
        "real-size read of the weights": read,
        "load (llama-server maps the weights)": load,
    }


def model(p: ServingProfile) -> ColdStart:
    io = INSTANCES[p.hardware.instance_type]
    size = p.model.size_bytes
    gp3 = p.fleet.volume.volume_throughput_mibps * MIB
    disk = min(gp3, io.ebs_bps)
    bound = "gp3 throughput" if gp3 <= io.ebs_bps else "instance EBS bandwidth"
    ms = min(a("modelscope_stream_bps") * a("modelscope_streams"), io.network_bps, disk)
    s3 = min(a("s3_stream_bps") * a("s3_streams"), io.network_bps, disk)
    # Weights stay in the page cache after the download only if RAM holds them next to the server's own memory.
    fits = size / 1024**3 + 6 < p.hardware.memory_gib
    load = size / a("page_cache_bps") if fits else size / disk
    upload_read = size / a("page_cache_bps") if fits else size / disk
    upload = max(upload_read, size / min(io.network_bps, a("s3_stream_bps") * a("s3_streams")))
    return ColdStart(
        profile=p.name,
        instance=p.hardware.instance_type,
        model_bytes=size,
        gp3_bps=gp3,
        disk_bps=disk,
        disk_bound=bound,
        modelscope_s=size / ms,
        s3_s=size / s3,
        upload_s=upload,
        load_s=load,
        load_from="page cache" if fits else "EBS (model larger than RAM headroom)",
        image_s=a("ecr_fixed_s") + io.image_bytes / a("ecr_bps"),
    )


def fmt_s(s: float) -> str:
    return f"{s / 60:.1f} min" if s >= 120 else f"{s:.0f} s"


def _unit(name: str, value: float) -> str:
    if name.endswith("_bps"):
        return f"{value / MIB:g} MiB/s" if value < 1e9 else f"{value / 1e9:g} GB/s"
    return f"{value:g} s" if name.endswith("_s") else f"{value:g}"


def production_rates(p: ServingProfile) -> Rates:
    """The S3-cache boot of one profile's instance: the Rates `steps` takes, from the sourced figures above. The
    weights stay in the page cache only when RAM holds them next to the server; a file larger than that is read
    back from the volume whole (the page cache keeps the end of a sequential write, which a read from the start
    evicts before it reaches it)."""
    io = INSTANCES[p.hardware.instance_type]
    disk = min(p.fleet.volume.volume_throughput_mibps * MIB, io.ebs_bps)
    return Rates(
        network_bps=min(a("s3_stream_bps") * a("s3_streams"), io.network_bps),
        hash_bps=a("hash_bps"),
        disk_bps=disk,
        page_cache_bps=a("page_cache_bps"),
        dirty_limit=a("dirty_share") * p.hardware.memory_gib * 1024**3,
        image_bps=a("ecr_bps"),
        image_fixed_s=a("ecr_fixed_s"),
        disk_read_bps=disk,
        cached_share=1.0 if model(p).load_from == "page cache" else 0.0,
    )


def print_steps(profiles: list[ServingProfile]) -> None:
    """Scale-out from the S3 cache, step by step, and the step that bounds it."""
    print("| profile | image pull | fetch (network) | verify after it | write after it | load | server init | "
          "to /health | slowest step | warm pool to /health |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|")
    for p in profiles:
        io, r = INSTANCES[p.hardware.instance_type], production_rates(p)
        s = steps(p.model.size_bytes, int(io.image_bytes), r)
        parts = {
            "image pull": s["image pull"],
            "fetch (network)": s["fetch (network)"],
            "verify": s["verify (hash after the last byte)"],
            "write": s["write (fsync after the hash)"],
            "load": s["load (llama-server maps the weights)"],
            "server init": a("server_init_s"),
        }
        slowest = max(parts, key=lambda k: parts[k])
        total = a("boot_s") + sum(parts.values())
        bound = "network" if r.network_bps < r.disk_bps else "volume"
        print(
            f"| {p.name} | " + " | ".join(fmt_s(v) for v in parts.values()) + f" | {fmt_s(total)} | {slowest} "
            f"({bound}-bound: {min(r.network_bps, r.disk_bps) / MIB:.0f} MiB/s) | {fmt_s(model(p).warm_pool_s)} |"
        )


def main() -> int:
    profiles = list(load_catalog().profiles.values())
    rows = [model(p) for p in profiles]
    print("| profile | instance | model | volume writes at | ModelScope fetch | S3 fetch | load from | load | "
          "first instance to /health | scale-out to /health | warm pool to /health |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r.profile} | {r.instance} | {r.model_bytes / 1e9:.1f} GB | {r.disk_bps / MIB:.0f} MiB/s "
            f"({r.disk_bound}) | {fmt_s(r.modelscope_s)} | {fmt_s(r.s3_s)} | {r.load_from} | {fmt_s(r.load_s)} | "
            f"{fmt_s(r.first_instance_s)} (incl. {fmt_s(r.upload_s)} upload) | {fmt_s(r.scale_out_s)} | "
            f"{fmt_s(r.warm_pool_s)} |"
        )
    print()
    print(f"Scale-out from the S3 cache, step by step (launch to user data: {a('boot_s'):g} s before these):")
    print_steps(profiles)
    print()
    print("Assumptions:")
    for k, (v, why) in ASSUMPTIONS.items():
        print(f"- {k} = {_unit(k, v)}: {why}")
    print("- instance network / EBS burst bandwidth (AWS instance-type pages, not verified here): "
          + "; ".join(f"{k} {v.network_bps / GBIT:g} / {v.ebs_bps / GBIT:g} Gbit/s, image {v.image_bytes / 1e9:g} GB"
                      for k, v in INSTANCES.items()))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
