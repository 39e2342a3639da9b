"""The scaler: a Deployment's replicas from llama.cpp's own load signals, and its node group following the pods.

Why a controller of our own: a HorizontalPodAutoscaler reads custom or external metrics only through a metrics
adapter, and the usual ones (prometheus-adapter, KEDA) and the cluster autoscaler are images from registry.k8s.io
or ghcr.io, which nothing in the region may pull at deploy. This runs from the serving image, already in the
region's ECR, and does what the EC2 stacks' scaling policies do (stacks/scaling.py), on the same signals:
- busy slots (llamacpp:requests_processing) tracked to `target_busy_ratio` of the pods' slots;
- waiting requests (llamacpp:requests_deferred) add a pod at once, two past four times the step;
- requests the hop shed with 429 (gguf_serve_requests_shed_total rising) add a pod at once.
Scale-in waits until every recommendation of the last `scale_in_after_s` agrees, then goes one pod at a time,
taking the least busy pod first (the pod-deletion-cost annotation); its preStop hook drains it.
Nodes follow pods one to one (a serving pod asks for its whole node): the node group's Auto Scaling group is set to
the replicas on the way out, and on the way in the scaler terminates a node that holds no serving pod, with
ShouldDecrementDesiredCapacity, as the cluster autoscaler does on AWS (never a node that still serves).
A pod on a cordoned node (kubectl drain, a node group upgrade) is replaced before it goes: the scaler adds a replica
for it, and once the replacement is ready, takes the replica back with the cordoned pod marked to go first. The
disruption budget (stacks/eks/manifests.py: minAvailable, the profile's minimum) holds the drain's own eviction
until then, so a profile at its minimum never has fewer pods serving than that.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from gguf_serve.container.hop import names as hop_names
from gguf_serve.container.kube.api import KubeApi, KubeError, Node, Pod
from gguf_serve.container.kube.usage import FleetUsage
from gguf_serve.container.metrics.scrape import ScrapeError, scrape_metrics

log = logging.getLogger("gguf-serve-scaler")

PROCESSING = "llamacpp:requests_processing"
DEFERRED = "llamacpp:requests_deferred"
DELETION_COST = "controller.kubernetes.io/pod-deletion-cost"  # lower goes first on scale-in (Kubernetes docs)
GO_FIRST = str(-(2**31))  # the lowest deletion cost (an int32: "Pod deletion cost", Kubernetes docs)


@dataclass(frozen=True)
class ScalePolicy:
    min_replicas: int
    max_replicas: int
    slots: int  # llama-server slots per pod
    target_busy_ratio: float = 0.7
    deferred_step: int = 1  # waiting requests that add a pod at once
    scale_in_after_s: float = 300.0
    node_grace_s: float = 600.0  # a node younger than this may still be waiting for its pod: never taken away

    def __post_init__(self) -> None:
        if not 0 <= self.min_replicas <= self.max_replicas or self.max_replicas < 1:
            raise ValueError(f"replicas {self.min_replicas}-{self.max_replicas}: need 0 <= min <= max, max >= 1")
        if self.slots < 1 or not 0 < self.target_busy_ratio <= 1 or self.deferred_step < 1:
            raise ValueError("slots and deferred_step must be at least 1, target_busy_ratio in (0, 1]")


@dataclass(frozen=True)
class PodLoad:
    name: str
    processing: float
    deferred: float
    shed_total: float  # the hop's counter; the scaler takes its increase
    draining: bool
    output_tokens_total: float = 0.0  # the hop's counter of relayed output tokens (usage.py: the live cost)


def recommend(policy: ScalePolicy, current: int, loads: list[PodLoad], shed: float) -> tuple[int, str]:
    """The replicas the signals ask for now, and why (one log line)."""
    serving = [load for load in loads if not load.draining]
    busy = sum(load.processing for load in serving)
    waiting = sum(load.deferred for load in serving)
    want = math.ceil(busy / (policy.slots * policy.target_busy_ratio) - 1e-9) if busy else policy.min_replicas
    why = f"{busy:g} busy slots of {len(serving) * policy.slots}, {waiting:g} waiting, {shed:g} shed"
    if waiting >= policy.deferred_step:
        want = max(want, current + (2 if waiting >= 4 * policy.deferred_step else 1))
    if shed > 0:
        want = max(want, current + 1)
    return max(policy.min_replicas, min(policy.max_replicas, want)), why


class Stabilizer:
    """Scale out at once; scale in only to the highest recommendation of the window, one pod per step."""

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.history: deque[tuple[float, int]] = deque()
        self.since: float | None = None  # the first step: a window not yet watched whole never scales in

    def decide(self, now: float, current: int, recommended: int) -> int:
        self.since = now if self.since is None else self.since
        self.history.append((now, recommended))
        while self.history and self.history[0][0] < now - self.window_s:
            self.history.popleft()
        if recommended >= current:
            return recommended
        if now - self.since < self.window_s:
            return current
        return max(max(r for _, r in self.history), current - 1)


class NodeGroup:
    """The managed node group's Auto Scaling group, through the EC2 Auto Scaling API (as the cluster autoscaler)."""

    def __init__(self, cluster: str, nodegroup: str, clients: Callable[[str], Any]) -> None:
        self.cluster, self.nodegroup, self.clients = cluster, nodegroup, clients
        self._group: str | None = None

    def group(self) -> str:
        if self._group is None:
            found = self.clients("eks").describe_nodegroup(clusterName=self.cluster, nodegroupName=self.nodegroup)
            self._group = found["nodegroup"]["resources"]["autoScalingGroups"][0]["name"]
        return self._group

    def size(self) -> tuple[int, int]:
        """(desired, maximum) of the group."""
        groups = self.clients("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[self.group()])
        group = groups["AutoScalingGroups"][0]
        return int(group["DesiredCapacity"]), int(group["MaxSize"])

    def grow(self, size: int) -> None:
        self.clients("autoscaling").set_desired_capacity(AutoScalingGroupName=self.group(), DesiredCapacity=size)

    def remove(self, instance_id: str) -> None:
        self.clients("autoscaling").terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=True
        )


@dataclass
class Scaler:
    api: KubeApi
    namespace: str
    deployment: str
    selector: str  # the serving pods' labels
    policy: ScalePolicy
    api_key: Callable[[], str | None]
    port: int
    nodes: NodeGroup | None = None
    node_selector: str = ""  # the node group's nodes (eks.amazonaws.com/nodegroup=<name>)
    fixed_nodes: int = 0  # the profile's nodes outside `nodes` (an On-Demand floor beside a Spot group)
    profile_nodes: str = ""  # every node of the profile (gguf-serve/profile=<name>): where a cordon is looked for
    usage: FleetUsage | None = None  # publishes the profile's nodes, output tokens and busy slots (the live cost)

    def __post_init__(self) -> None:
        self.stabilizer = Stabilizer(self.policy.scale_in_after_s)
        self.shed_seen: dict[str, float] = {}
        self.replacing: set[str] = set()  # pods on cordoned nodes a replica was added for

    def step(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        every = self.api.pods(self.namespace, self.selector)  # a terminating pod still drains on its node
        pods = [p for p in every if not p.deleting]
        loads = [load for load in (self._load(p) for p in pods if p.ready and p.ip) if load is not None]
        shed = self._shed(loads)
        current = self.api.replicas(self.namespace, self.deployment)
        profile_nodes = self._profile_nodes()
        moving = self._on_cordoned(pods, profile_nodes)
        if self.usage is not None and profile_nodes is not None:
            tokens = {x.name: x.output_tokens_total for x in loads}
            self.usage.observe(now, nodes=len(profile_nodes), tokens_total=tokens,
                               processing=sum(x.processing for x in loads))  # fmt: skip
        self.replacing &= {p.name for p in moving}  # a replaced pod that is gone needs its replica no more
        base = current - len(self.replacing)  # the replicas the load has, without the ones added for a move
        recommended, why = recommend(self.policy, base, loads, shed)
        target = self.stabilizer.decide(now, base, recommended)
        names = {p.name for p in moving}
        settled = sum(p.ready for p in pods if p.name not in names)  # serving pods that are not leaving
        released = bool(moving) and settled >= target
        if released:  # the replacements serve: take the added replicas back, the cordoned pods going first
            self._rank_for_scale_in(loads, first=sorted(names))
            self.replacing.clear()
            why = f"{len(moving)} pod(s) on cordoned nodes replaced"
        elif moving:  # a replacement before a move: one replica more for each pod on a cordoned node
            self.replacing |= names
            target = min(target + len(self.replacing), self.policy.max_replicas + 1)
            why = f"replacing {len(self.replacing)} pod(s) on cordoned nodes first"
        if target != current:
            if target < current and not released:
                self._rank_for_scale_in(loads)
            self.api.scale(self.namespace, self.deployment, target)
            log.info("replicas %d -> %d (%s)", current, target, why)
        if self.nodes is not None:
            self._follow(max(target, len(pods)), every, now)
        return target

    def _profile_nodes(self) -> list[Node] | None:
        """Every node of the profile; None when there is no selector or the list failed (logged)."""
        if not self.profile_nodes:
            return None
        try:
            return self.api.nodes(self.profile_nodes)
        except KubeError as e:
            log.warning("cannot list the profile's nodes: %s", e)
            return None

    @staticmethod
    def _on_cordoned(pods: list[Pod], nodes: list[Node] | None) -> list[Pod]:
        cordoned = {n.name for n in nodes or [] if n.unschedulable}
        return [p for p in pods if p.node in cordoned]

    def _load(self, pod: Pod) -> PodLoad | None:
        try:
            scrape = scrape_metrics(f"http://{pod.ip}:{self.port}", self.api_key(), timeout=5.0)
        except ScrapeError as e:
            log.warning("pod %s: %s", pod.name, e)
            return None
        f = scrape.families

        def value(name: str) -> float:
            family = f.get(name)
            return (family.value() if family else None) or 0.0

        return PodLoad(
            pod.name, value(PROCESSING), value(DEFERRED), value(hop_names.SHED), value(hop_names.DRAINING) > 0,
            value(hop_names.OUTPUT_TOKENS),
        )  # fmt: skip

    def _shed(self, loads: list[PodLoad]) -> float:
        """Requests shed since the last step, over pods seen then (a new or restarted pod's counter starts over)."""
        total = 0.0
        for load in loads:
            before = self.shed_seen.get(load.name)
            if before is not None and load.shed_total >= before:
                total += load.shed_total - before
        self.shed_seen = {load.name: load.shed_total for load in loads}
        return total

    def _rank_for_scale_in(self, loads: list[PodLoad], first: list[str] | None = None) -> None:
        """Each pod's deletion cost: its busy and waiting requests (the least busy goes first), `first` lowest."""
        costs = {load.name: str(int(load.processing + load.deferred)) for load in loads}
        costs.update({name: GO_FIRST for name in first or []})
        for name, cost in costs.items():
            try:
                self.api.annotate(self.namespace, name, {DELETION_COST: cost})
            except KubeError as e:
                log.warning("pod %s: cannot set %s: %s", name, DELETION_COST, e)

    def _follow(self, need: int, pods: list[Pod], now: float) -> None:
        """`need`: nodes for the pods wanted and those still starting (a rollout's surge); `pods`: every serving pod,
        terminating ones too: a node whose pod drains is not empty."""
        assert self.nodes is not None
        need = max(0, need - self.fixed_nodes)  # the floor's nodes hold that many pods; the group the rest
        desired, most = self.nodes.size()
        if need > desired:
            size = min(need, most)
            if size > desired:
                self.nodes.grow(size)
                log.info("node group %s: %d -> %d nodes", self.nodes.nodegroup, desired, size)
            return
        if desired <= need:
            return
        used = {p.node for p in pods}
        for node in self.api.nodes(self.node_selector):
            if node.name in used or node.instance_id is None or _age_s(node, now) < self.policy.node_grace_s:
                continue
            self.nodes.remove(node.instance_id)
            log.info(
                "node group %s: node %s (%s) holds no serving pod: terminated",
                self.nodes.nodegroup,
                node.name,
                node.instance_id,
            )
            return  # one per step: the next step sees the group's new size


def _age_s(node: Node, now: float) -> float:
    try:
        return now - datetime.fromisoformat(node.created.replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return 0.0
