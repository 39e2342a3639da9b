"""How many instances serve a profile and what disk they get."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FleetSettings:
    min_capacity: int = 1
    max_capacity: int = 4
    desired_capacity: int | None = None  # None: leave it to scaling
    volume_iops: int = 6000
    volume_throughput_mibps: int = 1000  # gp3 maximum: a 22 GB model reads in about 25 s
    image_headroom_gib: int = 20  # OS, container image layers, logs
