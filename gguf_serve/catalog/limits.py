"""The range of every number a profile file can set, inclusive, and the shape of its strings; the loader refuses
the rest with `file: table.key: what is wrong; allowed: ...`. A number missing here fails a test (tests/catalog)."""

from __future__ import annotations

import ipaddress
import math
from typing import Any

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.fleet import (
    AlarmSettings,
    BootPlan,
    Capacity,
    DrainSettings,
    LoadBalancerSettings,
    NetworkSettings,
    RootVolume,
    ScalingSettings,
)
from gguf_serve.catalog.hardware import Hardware
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.catalog.names import HUB_SHAPES, REVISION
from gguf_serve.container.names import UPSTREAM_PORT
from gguf_serve.container.server import ALL_LAYERS, MAX_QUEUE_PER_SLOT, ServerSettings, Speculative

# (low, high, unit): a float field accepts any finite number in range; NaN and infinities never pass.
RANGES: dict[type, dict[str, tuple[float, float, str]]] = {
    Hardware: {
        "vcpus": (1, 896, "vCPUs"),  # the largest EC2 instances (u7in) have 896 vCPUs
        "physical_cores": (1, 448, "cores"),
        "memory_gib": (0.5, 32768, "GiB"),
        "ami_root_snapshot_gib": (1, 16384, "GiB"),  # gp3's largest volume
        "ri_1yr_all_upfront_cny": (0, 1e8, "yuan"),
        "on_demand_cny_per_hour": (0, 1e5, "yuan per hour"),
        "gpu_memory_gib": (0, 2048, "GiB"),
        "host_reserve_gib": (0, 1024, "GiB"),
    },
    ModelArtifact: {
        "total_params_b": (0.001, 100_000, "billion parameters"),
        "active_params_b": (0.001, 100_000, "billion parameters"),
    },
    ServerSettings: {
        "ctx_per_slot": (512, 1_048_576, "tokens"),
        "parallel": (1, 256, "slots"),
        "threads": (1, 896, "threads"),
        "gpu_layers": (0, ALL_LAYERS, "layers (999: all)"),
        "cache_ram_mib": (0, 1_048_576, "MiB"),
        # The hop binds it as the containers' user (no privileged port: 1024 and up) beside llama-server's own.
        "port": (1024, 65535, f"TCP port, not {UPSTREAM_PORT} (llama-server's, behind the hop)"),
        "n_cpu_moe": (0, ALL_LAYERS, "blocks (999: all)"),
        "queue_per_slot": (0, MAX_QUEUE_PER_SLOT, "waiting requests per slot"),  # the hop's admission control
    },
    Speculative: {"draft_n_max": (1, 8, "draft tokens")},  # the report: acceptance falls above 2
    Capacity: {
        "min_capacity": (0, 100, "instances"),
        "max_capacity": (1, 100, "instances"),  # more is a quota request and a capacity plan, not a profile edit
        "desired_capacity": (0, 100, "instances"),
        "warm_pool_size": (0, 100, "instances"),
        "rolling_batch": (1, 100, "instances"),
    },
    RootVolume: {
        "volume_iops": (3000, 16000, "IOPS"),  # gp3
        "volume_throughput_mibps": (125, 1000, "MiB/s"),  # gp3
        "image_headroom_gib": (1, 1024, "GiB"),
    },
    BootPlan: {
        "package_install_s": (1, 7200, "s"),
        "image_pull_gib": (0.01, 100, "GiB"),
        "image_pull_mib_s": (0.1, 100_000, "MiB/s"),
        "planning_download_mib_s": (0.1, 100_000, "MiB/s"),
        "cache_upload_mib_s": (0.1, 100_000, "MiB/s"),
        "cache_read_mib_s": (0.1, 100_000, "MiB/s"),
        "model_load_s": (1, 7200, "s"),
        "instance_start_s": (1, 7200, "s"),
    },
    NetworkSettings: {
        "max_azs": (1, 6, "zones"),
        "nat_gateways": (0, 6, "NAT gateways"),
    },
    LoadBalancerSettings: {
        "alb_idle_timeout_s": (1, 4000, "s"),  # ALB idle timeout
        "deregistration_delay_s": (0, 3600, "s"),  # target group deregistration delay
    },
    ScalingSettings: {
        "target_busy_slot_ratio": (0.05, 1.0, "of the slots"),
        "deferred_scale_out": (1, 1000, "queued requests"),
        "shed_scale_out_many": (2, 100000, "requests answered 429 in a minute"),
    },
    AlarmSettings: {
        "deferred_alarm": (1, 1000, "queued requests"),
        "cost_multiple": (0, 1000, "x the full-load figure"),
    },
    DrainSettings: {
        "longest_answer_tokens": (1, 262_144, "tokens"),
        "slowest_decode_tok_s": (0.1, 10_000, "tok/s"),
    },
}


def _ipv4_network(text: str) -> bool:
    try:
        ipaddress.IPv4Network(text)
    except ValueError:
        return False
    return True


def _ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


# Strings with a shape: (test, what is allowed).
FORMATS: dict[type, dict[str, tuple[Any, str]]] = {
    ServerSettings: {"host": (_ip, "an IP address to listen on, e.g. 0.0.0.0")},
    Speculative: {"spec_type": (lambda t: t == "draft-mtp", "'draft-mtp' (the model's own MTP head)")},
    NetworkSettings: {
        "vpc_cidr": (lambda t: _ipv4_network(t) and 16 <= ipaddress.IPv4Network(t).prefixlen <= 24,
                     "an IPv4 network from /16 to /24, e.g. 10.40.0.0/16"),
    },
    ModelArtifact: {"repo": HUB_SHAPES["repo"], "file": HUB_SHAPES["file"], "revision": (REVISION.fullmatch,
                    "a branch, tag or commit of letters, digits, '.', '_', '-', '/'")},
}  # fmt: skip


def check(cls: type, name: str, value: Any, where: str) -> None:
    """Refuse a number (or each number of a tuple) outside the field's range, or a string of the wrong shape."""
    test, allowed = FORMATS.get(cls, {}).get(name, (None, ""))
    if test is not None:
        for text in value if isinstance(value, tuple) else (value,):
            if isinstance(text, str) and not test(text):
                raise ProfileError(f"{where}.{name}: {text!r} is not allowed; allowed: {allowed}")
    if cls is ServerSettings and name == "port" and value == UPSTREAM_PORT:
        raise ProfileError(f"{where}.{name}: {value} is llama-server's port behind the hop; allowed: another")
    low, high, unit = RANGES.get(cls, {}).get(name, (None, None, ""))
    if low is None or value is None or isinstance(value, bool | str):
        return
    for v in value if isinstance(value, tuple) else (value,):
        if not isinstance(v, int | float) or isinstance(v, bool):
            continue
        if isinstance(v, float) and not math.isfinite(v):
            raise ProfileError(f"{where}.{name}: {v!r} is not a number; allowed: {_span(low, high)} {unit}")
        if not low <= v <= high:
            side = "below" if v < low else "above"
            raise ProfileError(f"{where}.{name}: {v!r} is {side} the range; allowed: {_span(low, high)} {unit}")


def _span(low: float, high: float) -> str:
    return " to ".join(f"{int(v):,}" if float(v).is_integer() else f"{v:g}" for v in (low, high))
