"""This machine as a serving profile: the embedded default (`make demo`, the local runner, the benchmarks)."""

from __future__ import annotations

import os
import platform
from dataclasses import replace

from gguf_serve.catalog.fleet import FleetSettings
from gguf_serve.catalog.hardware import Architecture, Hardware
from gguf_serve.catalog.images import IMAGE_TARGETS
from gguf_serve.catalog.loader import Catalog
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.catalog.profiles import ServingProfile

EMBEDDED_MODEL = "Gemma-3-270M"  # profiles/models.toml: the small real model the local path serves


def local_profile(
    catalog: Catalog, base: str = "graviton-moe", *, model: ModelArtifact | None = None, port: int = 8080
) -> ServingProfile:
    """The base profile's server settings scaled to this machine, serving a small model (the embedded default)."""
    cores = os.cpu_count() or 1
    arch = Architecture.ARM64 if platform.machine() in ("aarch64", "arm64") else Architecture.X86_64
    hw = Hardware(
        instance_type="local",
        architecture=arch,
        vcpus=cores,
        physical_cores=cores,
        memory_gib=host_memory_gib(),
        cpu=platform.processor() or platform.machine(),
        ami_ssm_parameter="",
        ami_root_snapshot_gib=0,
        host_reserve_gib=1.0,
    )
    model = model or catalog.models[EMBEDDED_MODEL]
    src = catalog.profiles[base]
    server = replace(src.server, ctx_per_slot=4096, threads=None, cache_ram_mib=256, host="127.0.0.1", port=port)
    image = next(t for t in IMAGE_TARGETS.values() if t.architecture == arch and t.accelerator is None)
    return ServingProfile(
        name=f"local-{base}",
        stack_name="",
        hardware=hw,
        model=model,
        server=server,
        image=image,
        fleet=FleetSettings().changed(min_capacity=1, max_capacity=1),
        description=f"{src.name} settings on this machine with {model.name}",
    )


def host_memory_gib() -> float:
    try:
        with open("/proc/meminfo") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        return kib / 1024 / 1024
    except (OSError, StopIteration, ValueError):
        return 8.0
