"""One stack as it deploys: the catalog's profile, untouched, and the deploy options (one typed value, DeployOptions)
resolved against it here, in one place, the Spot rules among them. ServingStack builds from a plan; the pre-flight
reads the same plans (gguf_serve/preflight/plan.py), never a stack's attributes."""

from __future__ import annotations

from dataclasses import dataclass, replace

from gguf_serve.catalog.fleet import Capacity, FleetSettings
from gguf_serve.catalog.hardware import Hardware
from gguf_serve.catalog.images import ImageTarget
from gguf_serve.catalog.loader import ProfileFrame
from gguf_serve.catalog.profiles import ServingProfile
from stacks.options import DeployOptionError, DeployOptions


@dataclass(frozen=True)
class ServicePlan:
    """What one stack deploys. `profile` is None when its model has no lock entry yet: nothing to build, but the
    instance, zones and vCPUs it will ask of the account are known (the pre-flight checks them)."""

    stack_name: str
    hardware: Hardware
    image: ImageTarget
    fleet: FleetSettings  # the profile's [fleet], as the catalog holds it
    options: DeployOptions  # deploy.toml and -c, as given
    capacity: Capacity  # the group's sizes as deployed: the profile's, minCapacity and warmPool applied, Spot rules
    spot: bool  # all Spot: spot=true on a CPU stack
    zones: tuple[str, ...]  # the region's pinned zones (cdk.context.json); the VPC spans the first max_azs
    profile: ServingProfile | None = None

    @property
    def vpc_zones(self) -> tuple[str, ...]:
        """The zones the VPC's subnets are in: the first max_azs pinned ones, as ec2.Vpc picks them."""
        return self.zones[: self.fleet.network.max_azs]

    @property
    def sleeps(self) -> bool:
        """The group is at zero at times: off hours, or no instance kept (min capacity 0)."""
        return self.capacity.min_capacity == 0 or self.options.off_hours is not None

    @property
    def wake_s(self) -> int:
        """Expected seconds from a wake-up to /health 200, with this deploy's warm pool (none on Spot)."""
        assert self.profile is not None, f"{self.stack_name}: no profile to plan a wake-up from"
        return self.profile.wake_up_s(warm_pool=self.capacity.warm_pool_size > 0)

    def vcpu_plan(self) -> dict[str, int]:
        return self.capacity.vcpu_plan(self.hardware.vcpus)

    def spot_vcpu_plan(self) -> tuple[dict[str, int], dict[str, int]]:
        """(On-Demand, Spot) vCPUs of a Spot group (Capacity.spot_vcpu_plan)."""
        return self.capacity.spot_vcpu_plan(self.hardware.vcpus)

    @property
    def root_volume_gib(self) -> int:
        """0 until the model is locked (its size is part of the volume)."""
        return self.profile.root_volume_gib if self.profile else 0


def deployed_capacity(fleet: Capacity, hardware: Hardware, options: DeployOptions) -> tuple[Capacity, bool]:
    """The group's sizes and whether it is all Spot, for these deploy options: the Spot rules live here only."""
    # g5 Spot capacity in China is scarce: a GPU stack stays On-Demand whatever `spot` says.
    spot = options.spot and not hardware.has_gpu
    warm = fleet.warm_pool_size if options.warm_pool is None else options.warm_pool
    minimum = fleet.min_capacity if options.min_capacity is None else options.min_capacity
    # PutWarmPool "cannot be called on an Auto Scaling group that has a mixed instances policy or a launch
    # template ... that requests Spot Instances" (EC2 Auto Scaling API Reference): a Spot group goes without one.
    return replace(fleet, min_capacity=minimum, warm_pool_size=0 if spot else warm), spot


def plan_service(frame: ProfileFrame | ServingProfile, options: DeployOptions, zones: tuple[str, ...]) -> ServicePlan:
    """A stack's plan from its profile (or, while its model is unlocked, from the rest of its profile file)."""
    capacity, spot = deployed_capacity(frame.fleet.capacity, frame.hardware, options)
    bounds = [("minCapacity", capacity.min_capacity, "max_capacity", capacity.max_capacity),
              ("warmPool", capacity.warm_pool_size, "max_capacity", capacity.max_capacity)]  # fmt: skip
    if capacity.desired_capacity is not None:
        bounds.append(("minCapacity", capacity.min_capacity, "desired_capacity", capacity.desired_capacity))
    for option, value, key, bound in bounds:
        if value > bound:
            raise DeployOptionError(
                f"{option}: {value} is more than {frame.stack_name}'s {key} ({bound}); lower it, or raise {key} in "
                f"[fleet] of profiles/serving/{frame.name}.toml"
            )
    return ServicePlan(
        stack_name=frame.stack_name,
        hardware=frame.hardware,
        image=frame.image,
        fleet=frame.fleet,
        options=options,
        capacity=capacity,
        spot=spot,
        zones=zones,
        profile=frame if isinstance(frame, ServingProfile) else None,
    )


def plan_eks(
    profiles: dict[str, ServingProfile], options: DeployOptions, zones: tuple[str, ...]
) -> tuple[ServicePlan, ...]:
    """EksServingStack's profiles (eksProfiles), by name, each planned as its own stack would be (the Spot rule,
    minCapacity): the cluster's node groups read them."""
    unknown = [n for n in options.eks_profiles if n not in profiles]
    if unknown:
        raise DeployOptionError(
            f"eksProfiles: no serving profile named {', '.join(unknown)}; use some of {', '.join(sorted(profiles))}"
        )
    return tuple(plan_service(profiles[n], options, zones) for n in options.eks_profiles)
