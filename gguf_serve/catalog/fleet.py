"""A profile's [fleet] table, read as the parts the constructs take: each construct gets its own small part, never
the whole table. The TOML stays one flat [fleet] table; a key names the field of the part that holds it. One line
per field: what it is, its unit and its default; the range of every number is in limits.py.

Who reads what: ServingFleet `Capacity` and `RootVolume`; FleetScaling `Capacity` and `ScalingSettings`;
ServiceMonitoring `AlarmSettings`; ServingNetwork `NetworkSettings`; InferenceLoadBalancer `LoadBalancerSettings`;
the profile's boot and wake plans `BootPlan` (the fleet's hook, grace and warm-up, the wake door's Retry-After);
the boot script and the alarms `DrainSettings`. Deploy options (stacks/options.py) are not here: a stack's plan
(stacks/plan.py) applies them on top of these, and the catalog keeps what the profile says.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace


@dataclass(frozen=True)
class Capacity:
    """The Auto Scaling group's size."""

    min_capacity: int = 1  # instances always running; 0: none between requests. Deploy option minCapacity overrides
    max_capacity: int = 4  # instances at full scale-out
    desired_capacity: int | None = None  # instances at create; None: leave it to scaling
    warm_pool_size: int = 1  # stopped instances that hold the verified model; 0: none. Deploy option warmPool overrides
    rolling_batch: int = 1  # instances a rolling update launches beside the running ones
    # With the deploy option spot: more instance types for the Spot pools (capacity-optimized across all of them),
    # each a type of profiles/hardware.toml with the profile's architecture, vCPUs and cores (the same runtime spec)
    # and checked against the profile's memory plan at load; the instances a deploy or an update waits for are
    # On-Demand (stacks/fleet.py).
    spot_instance_types: tuple[str, ...] = ()

    def vcpu_plan(self, vcpus_per_instance: int) -> dict[str, int]:
        """vCPUs running at once, against the account's On-Demand (or Spot) vCPU quota.

        create: the first instances and the warm pool's boot together (warm-pool instances run their user data,
        then stop); update: a rolling update adds `rolling_batch` instances beside those; scale_out: every instance
        up to max_capacity, the warm pool refilling.
        """
        running = self.min_capacity + self.warm_pool_size
        return {
            "create": running * vcpus_per_instance,
            "update": (running + self.rolling_batch) * vcpus_per_instance,
            "scale_out": (self.max_capacity + self.warm_pool_size) * vcpus_per_instance,
        }

    def on_demand_base(self) -> int:
        """A Spot group's On-Demand instances: what a deploy or a rolling update waits for (min_capacity plus the
        rolling batch), so an empty Spot pool never stalls either; none for a group that sleeps at zero."""
        return self.min_capacity + self.rolling_batch if self.min_capacity else 0

    def spot_vcpu_plan(self, vcpus_per_instance: int) -> tuple[dict[str, int], dict[str, int]]:
        """A Spot group's vcpu_plan split into (On-Demand, Spot): the base runs On-Demand, the rest on Spot (its
        types have the same vCPUs: checked at load). A Spot group has no warm pool."""
        base, running = (
            self.on_demand_base(),
            {
                "create": self.min_capacity,
                "update": self.min_capacity + self.rolling_batch,
                "scale_out": self.max_capacity,
            },
        )
        on_demand = {phase: min(n, base) * vcpus_per_instance for phase, n in running.items()}
        spot = {phase: max(n - base, 0) * vcpus_per_instance for phase, n in running.items()}
        return on_demand, spot


@dataclass(frozen=True)
class RootVolume:
    """Each instance's encrypted gp3 root volume (its size: the AMI's snapshot + the model + the headroom)."""

    volume_iops: int = 4000  # IOPS; gp3 needs 1 IOPS per 0.25 MiB/s of throughput: 4000 for 1000 MiB/s
    volume_throughput_mibps: int = 1000  # MiB/s, gp3's maximum: a 22 GB model reads in about 25 s
    image_headroom_gib: int = 20  # GiB on top of the snapshot and the model: container image layers, logs, updates


@dataclass(frozen=True)
class BootPlan:
    """Planning figures for a cold first boot and a wake-up (ServingProfile.boot_plan_s, wake_plan_s)."""

    package_install_s: int = 180  # s: dnf installs docker and the CloudWatch agent from the in-region repositories
    image_pull_gib: float = 0.25  # GiB of compressed image an instance pulls (CPU goal <= 250 MB, CUDA <= 1.5 GB)
    image_pull_mib_s: float = 50.0  # MiB/s: ECR through the VPC endpoint, pull and extract, conservative
    planning_download_mib_s: float = 15.0  # MiB/s: the worst case, one ModelScope stream and no S3 cache yet
    cache_upload_mib_s: float = 50.0  # MiB/s: the synchronous write-back of a fresh download to the S3 model cache
    cache_read_mib_s: float = 50.0  # MiB/s: a later instance's read of the model from the S3 cache
    model_load_s: int = 300  # s: start the container, read the GGUF, warm up, with margin (also the scaling warm-up)
    instance_start_s: int = 60  # s: EC2 start or launch to user data running (a planning figure, not measured)


@dataclass(frozen=True)
class NetworkSettings:
    """The stack's VPC."""

    vpc_cidr: str = "10.40.0.0/16"  # the VPC's IPv4 range, a /16 to a /24
    max_azs: int = 2  # zones the subnets span (the first of cdk.context.json's pinned zones), 1-6
    nat_gateways: int = 1  # one is enough for a download at boot; max_azs for zone-independent egress


@dataclass(frozen=True)
class LoadBalancerSettings:
    """The internal Application Load Balancer and its target group."""

    alb_idle_timeout_s: int = 600  # s: > the report's longest generation, 2048 tokens at 4.56 tok/s = 449 s
    deregistration_delay_s: int = 600  # s a leaving instance keeps its running streams


@dataclass(frozen=True)
class ScalingSettings:
    """Scaling on llama.cpp's own load signals (not CPU, which is always 100% busy)."""

    target_busy_slot_ratio: float = 0.7  # target tracking on the share of busy slots, 0.05-1
    deferred_scale_out: int = 1  # queued requests (llamacpp:requests_deferred) that add an instance at once
    shed_scale_out_many: int = 30  # requests the hop answered 429 in a minute, group-wide, that add two instances


@dataclass(frozen=True)
class AlarmSettings:
    """What pages someone."""

    deferred_alarm: int = 4  # queued requests, sustained 5 minutes
    # A day's real yuan per million output tokens above this multiple of the profile's full-load figure (the report's
    # one-stream rate at 100% utilization): idle capacity costs that much. 0: no such alarm.
    cost_multiple: float = 0.0


@dataclass(frozen=True)
class DrainSettings:
    """The longest answer a drain waits for (scale-in, rolling update, warm-pool return, Spot notice): the report's
    longest generation at its slowest measured single stream (the ALB idle timeout's reasoning)."""

    longest_answer_tokens: int = 2048  # tokens
    slowest_decode_tok_s: float = 4.56  # tok/s

    @property
    def deadline_s(self) -> int:
        """Seconds an instance leaving the group keeps serving the streams it has: the longest expected answer."""
        return -(-self.longest_answer_tokens * 100 // round(self.slowest_decode_tok_s * 100))


@dataclass(frozen=True)
class FleetSettings:
    """The whole [fleet] table: its parts, each handed to the constructs that read it (above)."""

    capacity: Capacity = field(default_factory=Capacity)
    volume: RootVolume = field(default_factory=RootVolume)
    boot: BootPlan = field(default_factory=BootPlan)
    network: NetworkSettings = field(default_factory=NetworkSettings)
    load_balancer: LoadBalancerSettings = field(default_factory=LoadBalancerSettings)
    scaling: ScalingSettings = field(default_factory=ScalingSettings)
    alarms: AlarmSettings = field(default_factory=AlarmSettings)
    drain: DrainSettings = field(default_factory=DrainSettings)

    @classmethod
    def parts(cls) -> dict[str, type]:
        """Attribute -> part type, in order: the loader files each flat [fleet] key under the part that has it."""
        return {f.name: f.default_factory for f in fields(cls)}  # type: ignore[misc]

    def changed(self, **flat: object) -> FleetSettings:
        """A copy with [fleet] keys changed, named as a profile file names them (`changed(min_capacity=0)`)."""
        known = {f.name: name for name, part in self.parts().items() for f in fields(part)}
        unknown = sorted(set(flat) - set(known))
        if unknown:
            raise TypeError(f"unknown [fleet] keys {unknown}; known: {sorted(known)}")
        updates: dict[str, dict[str, object]] = {}
        for key, value in flat.items():
            updates.setdefault(known[key], {})[key] = value
        return replace(self, **{name: replace(getattr(self, name), **values) for name, values in updates.items()})
