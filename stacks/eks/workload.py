"""What a serving profile runs on Kubernetes, cut out of the profile as InstanceSpec is for an instance.

`ServingWorkload.of(profile)` is the one place a profile's numbers become a pod's: the runtime spec (llama-server
on the pod's loopback, the hop on the serving port), probes sized from the load budget, the termination grace from
the drain deadline, the resources that make one pod fill one node. `stacks.eks.manifests` turns it into objects.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from gguf_serve.catalog import ProfileError, ServingProfile
from gguf_serve.catalog.fleet import Capacity
from gguf_serve.catalog.hardware import GIB
from gguf_serve.catalog.profiles import memory_fit
from gguf_serve.container import names

NAMESPACE = "gguf-serve"
PROFILE_LABEL = "gguf-serve/profile"  # node label and taint key, pod label: which profile a node or pod serves
STARTUP_PERIOD_S = 10
DRAIN_MARGIN_S = 30  # the preStop hook's poll, the hop's and llama-server's exits after the drain deadline
SYSTEM_CPU = 1  # vCPUs left on a serving node for the kubelet, the container runtime and the hop
MODEL_HEADROOM_GIB = 2  # node-local model volume beyond the GGUF: the fetcher's part file is renamed, never copied
FIRST_NODE_PORT = 30080  # NodePorts from here, one per profile (the default range is 30000-32767)
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


@dataclass(frozen=True)
class ServingWorkload:
    """A profile as a Deployment: every number the manifests need, and nothing else of the profile."""

    name: str  # the profile's name: Deployment, Service, ConfigMap, service account, label value
    runtime_json: str  # llama-server on 127.0.0.1:UPSTREAM_PORT inside the pod; the hop takes SERVER_PORT
    port: int  # the hop's port in the pod
    slots: int
    gpu: bool
    cpu: int  # llama-server's CPU request: the node's vCPUs less SYSTEM_CPU
    memory_gib: int  # llama-server's memory request and limit
    model_gib: int  # the node-local model volume (emptyDir sizeLimit, ephemeral-storage request)
    load_s: int  # llama-server's start to /health 200 (startup probe budget)
    fetch_s: int  # the init container's worst case: a cold ModelScope download and the S3 write-back
    drain_deadline_s: int
    min_replicas: int
    max_replicas: int
    target_busy_ratio: float
    deferred_step: int

    @classmethod
    def of(cls, profile: ServingProfile, capacity: Capacity | None = None) -> ServingWorkload:
        """capacity: the group's sizes as deployed (stacks/plan.py: minCapacity applied); default the profile's."""
        if not _NAME.match(profile.name) or len(profile.name) > 40 or profile.name.endswith("-scaler"):
            raise ProfileError(
                f"profile {profile.name!r}: an EKS workload name must be lower-case letters, digits and '-' (at most "
                "40), not ending in -scaler (its scaler's name): rename the profile file"
            )
        spec = profile.runtime()
        pod_spec = replace(spec, server=replace(spec.server, host="127.0.0.1", port=names.UPSTREAM_PORT))
        plan, f = profile.boot_plan_s(), profile.fleet
        capacity = capacity or f.capacity
        return cls(
            name=profile.name,
            runtime_json=pod_spec.to_json(),
            port=names.SERVER_PORT,
            slots=profile.server.parallel,
            gpu=profile.hardware.has_gpu,
            cpu=max(1, profile.hardware.vcpus - SYSTEM_CPU),
            memory_gib=pod_memory_gib(profile),
            model_gib=math.ceil(profile.model.size_bytes / GIB) + MODEL_HEADROOM_GIB,
            load_s=f.boot.model_load_s,
            fetch_s=math.ceil(plan["model_download"] + plan["cache_write_back"]),
            drain_deadline_s=f.drain.deadline_s,
            min_replicas=max(1, capacity.min_capacity),  # no wake-up from zero on EKS (docs/eks.md says why)
            max_replicas=capacity.max_capacity,
            target_busy_ratio=f.scaling.target_busy_slot_ratio,
            deferred_step=f.scaling.deferred_scale_out,
        )

    @property
    def startup_failures(self) -> int:
        """Startup probe failures allowed: the load budget in probe periods, and one more."""
        return math.ceil(self.load_s / STARTUP_PERIOD_S) + 1

    @property
    def grace_s(self) -> int:
        return self.drain_deadline_s + DRAIN_MARGIN_S

    @property
    def progress_deadline_s(self) -> int:
        """A new pod's worst start: fetch, then load (the Deployment reports no progress after this)."""
        return self.fetch_s + self.load_s + 60


def pod_memory_gib(profile: ServingProfile) -> int:
    """llama-server's memory in the pod: the profile's whole plan on CPU; on a GPU what stays in host RAM (the prompt
    cache, experts kept on the CPU), with the host reserve as the process's own headroom."""
    plan = profile.memory_plan()
    if profile.on_gpu:
        host = plan["prompt_cache"] + plan.get("cpu_experts", 0.0) + profile.hardware.host_reserve_gib
    else:
        need, _, _ = memory_fit(profile)
        host = need - profile.hardware.host_reserve_gib  # the reserve is the node's, outside the pod
    return math.ceil(host)


def node_port(index: int) -> int:
    return FIRST_NODE_PORT + index
