"""How many instances serve a profile and what disk they get."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class FleetSettings:
    min_capacity: int = 1
    max_capacity: int = 4
    desired_capacity: int | None = None  # None: leave it to scaling
    volume_iops: int = 4000  # gp3 needs 1 IOPS per 0.25 MiB/s of throughput: 4000 for 1000 MiB/s
    volume_throughput_mibps: int = 1000  # gp3 maximum: a 22 GB model reads in about 25 s
    image_headroom_gib: int = 20  # on top of the AMI's own snapshot: container image layers, logs, updates
    alb_idle_timeout_s: int = 600  # > the report's longest generation: 2048 tokens at 4.56 tok/s = 449 s
    deregistration_delay_s: int = 600  # lets a stream that is already running finish
    # Boot budget (creation signal, launch hook heartbeat, health-check grace): every step of a cold first boot.
    package_install_s: int = 180  # dnf: docker and the CloudWatch agent from the in-region OS repositories
    image_pull_gib: float = 0.25  # compressed image an instance pulls (CPU goal <= 250 MB; CUDA goal <= 1.5 GB)
    image_pull_mib_s: float = 50.0  # ECR through the VPC endpoint, pull and extract, conservative
    planning_download_mib_s: float = 15.0  # worst case: one ModelScope stream, no S3 cache yet
    cache_upload_mib_s: float = 50.0  # the synchronous write-back of a fresh download to the S3 model cache
    cache_read_mib_s: float = 50.0  # a later instance's read of the model from the S3 cache (a wake-up without a pool)
    model_load_s: int = 300  # start container + read the GGUF + warm up, with margin
    instance_start_s: int = 60  # EC2 start or launch to user data/units running (a planning figure, not measured)
    allowed_cidrs: tuple[str, ...] = ()  # who may call the internal ALB; empty: the VPC only
    vpc_cidr: str = "10.40.0.0/16"
    max_azs: int = 2
    nat_gateways: int = 1  # one is enough for a download at boot; use max_azs for AZ-independent egress
    target_busy_slot_ratio: float = 0.7  # target tracking on llama.cpp's busy slots, not CPU (always 100% busy)
    deferred_scale_out: int = 1  # queued requests (llamacpp:requests_deferred) that add an instance at once
    shed_scale_out_many: int = 30  # requests the hop answered 429 in a minute, group-wide, that add two instances
    deferred_alarm: int = 4  # queued requests, sustained 5 minutes, that page someone
    warm_pool_size: int = 1  # stopped instances that already hold the verified model
    rolling_batch: int = 1  # instances a rolling update launches beside the running ones
    spot: bool = False  # CPU stacks only: Spot capacity with capacity rebalancing
    # With spot: more instance types for the Spot pools (capacity-optimized across all of them), each a type of
    # profiles/hardware.toml with the profile's architecture, vCPUs and cores (the same runtime spec) and checked
    # against the profile's memory plan at load; the instances a deploy or an update waits for are On-Demand.
    spot_instance_types: tuple[str, ...] = ()
    off_hours: tuple[int, int] | None = None  # (stop, start) hour in Asia/Shanghai on weekdays: scale to zero
    # The longest answer a drain waits for (scale-in, rolling update, warm-pool return): the report's longest
    # generation, 2048 tokens at its slowest measured single stream, 4.56 tok/s (the ALB idle timeout's reasoning).
    # A group at zero (off_hours, min_capacity 0) wakes on its first request: the wake door (stacks/wake_door.py)
    # answers it 503 + Retry-After and sets the group to one instance; the client retries until it is up.
    wake_on_request: bool = False
    longest_answer_tokens: int = 2048
    slowest_decode_tok_s: float = 4.56

    @property
    def sleeps(self) -> bool:
        """The group is at zero at times: off hours, or no instance kept (min_capacity 0)."""
        return self.min_capacity == 0 or self.off_hours is not None

    @property
    def drain_deadline_s(self) -> int:
        """Seconds an instance leaving the group keeps serving the streams it has: the longest expected answer."""
        return -(-self.longest_answer_tokens * 100 // round(self.slowest_decode_tok_s * 100))
