"""The scaler: its policy on llama.cpp's signals, its stabilization, and whole steps against a Kubernetes API stand-in
(tests/container/kube/kubeapi.py), pods answering /metrics on their own loopback addresses, and moto's EC2 Auto
Scaling for the node group's group (EKS's DescribeNodegroup is a stand-in: moto's names no group it created)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.hop import names as hop_names
from gguf_serve.container.kube.api import KubeApi
from gguf_serve.container.kube.scaler import (
    DELETION_COST,
    NodeGroup,
    PodLoad,
    ScalePolicy,
    Scaler,
    Stabilizer,
    recommend,
)
from gguf_serve.local.process import free_port
from tests.container.kube.kubeapi import KubeStandIn

POLICY = ScalePolicy(min_replicas=1, max_replicas=4, slots=2, target_busy_ratio=0.7, deferred_step=1)
LABELS = {"app.kubernetes.io/name": "gguf-serve", "gguf-serve/profile": "graviton-moe"}
SELECTOR = ",".join(f"{k}={v}" for k, v in LABELS.items())


def load(name: str, processing: float = 0, deferred: float = 0, shed: float = 0, draining: bool = False) -> PodLoad:
    return PodLoad(name, processing, deferred, shed, draining)


@pytest.mark.parametrize(
    ("current", "loads", "shed", "want"),
    [
        (1, [load("a")], 0, 1),  # idle: the floor
        (1, [load("a", processing=2)], 0, 2),  # 2 busy of 2 slots: 2 / (2 * 0.7) -> 2 pods
        (2, [load("a", 1), load("b", 1)], 0, 2),  # 2 busy of 4: ceil(1.43) = 2
        (2, [load("a", 2), load("b", 2)], 0, 3),  # 4 busy: ceil(2.86) = 3
        (1, [load("a", 2, deferred=1)], 0, 2),  # one waiting adds a pod at once
        (1, [load("a", 2, deferred=4)], 0, 3),  # four waiting add two
        (1, [load("a", 1)], 3, 2),  # shed requests add a pod
        (4, [load(n, 2, deferred=9) for n in "abcd"], 0, 4),  # never past the maximum
        (2, [load("a", 2, deferred=5, draining=True), load("b")], 0, 1),  # a draining pod's load is leaving
    ],
)
def test_recommend_tracks_busy_slots_and_adds_at_once_for_waiting_or_shed(current, loads, shed, want):
    assert recommend(POLICY, current, loads, shed)[0] == want


def test_scale_in_waits_for_the_whole_window_then_steps_one_pod_at_a_time():
    s = Stabilizer(window_s=300)
    assert s.decide(0, 3, 1) == 3
    assert s.decide(150, 3, 1) == 3  # not yet a whole window of agreement
    assert s.decide(300, 3, 1) == 2  # one pod, not two
    assert s.decide(310, 2, 4) == 4  # scale-out is at once
    assert s.decide(400, 4, 1) == 4  # a high recommendation within the window holds the size
    assert s.decide(620, 4, 1) == 3


def test_the_policy_refuses_nonsense():
    with pytest.raises(ValueError, match="min <= max"):
        ScalePolicy(min_replicas=3, max_replicas=2, slots=1)
    with pytest.raises(ValueError, match="slots"):
        ScalePolicy(min_replicas=1, max_replicas=2, slots=0)


class _Pod(ThreadingHTTPServer):
    """A pod's hop: /metrics with llama-server's gauges and the hop's shed counter, behind the API key."""

    daemon_threads = True

    def __init__(self, ip: str, port: int) -> None:
        self.processing, self.deferred, self.shed, self.tokens = 0, 0, 0, 0
        super().__init__((ip, port), _PodHandler)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()  # shutdown waits a poll


class _PodHandler(BaseHTTPRequestHandler):
    server: _Pod

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        if self.headers.get("Authorization") != "Bearer k":
            self.send_response(401)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        s = self.server
        body = (
            f"# TYPE llamacpp:requests_processing gauge\nllamacpp:requests_processing {s.processing}\n"
            f"# TYPE llamacpp:requests_deferred gauge\nllamacpp:requests_deferred {s.deferred}\n"
            f"# TYPE {hop_names.SHED} counter\n{hop_names.SHED} {s.shed}\n"
            f"# TYPE {hop_names.OUTPUT_TOKENS} counter\n{hop_names.OUTPUT_TOKENS} {s.tokens}\n"
        ).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def kube() -> Iterator[KubeStandIn]:
    api = KubeStandIn()
    yield api
    api.shutdown()
    api.server_close()


@pytest.fixture
def cluster(kube: KubeStandIn) -> Iterator[tuple[KubeStandIn, list[_Pod], int]]:
    port = free_port()
    pods = [_Pod(f"127.0.0.{i + 2}", port) for i in range(2)]
    for i, _ in enumerate(pods):
        kube.add_pod(f"serving-{i}", f"127.0.0.{i + 2}", f"node-{i}", labels=LABELS)
        kube.add_node(
            f"node-{i}", f"i-0000000000000000{i}", "2026-01-01T00:00:00Z", {"eks.amazonaws.com/nodegroup": "ng"}
        )
    kube.add_pod("other-team", "127.0.0.9", "node-9", labels={"app": "else"})
    kube.replicas = 2
    yield kube, pods, port
    for pod in pods:
        pod.shutdown()
        pod.server_close()


def _scaler(kube: KubeStandIn, port: int, nodes: NodeGroup | None = None) -> Scaler:
    return Scaler(
        api=KubeApi(kube.url, token_file=None, ca_file=None), namespace="gguf-serve", deployment="graviton-moe",
        selector=SELECTOR, policy=POLICY, api_key=lambda: "k", port=port, nodes=nodes,
        node_selector="eks.amazonaws.com/nodegroup=ng",
    )  # fmt: skip


def test_a_step_scales_out_on_waiting_requests_through_the_scale_subresource(cluster):
    kube, pods, port = cluster
    pods[0].processing, pods[0].deferred = 2, 1
    assert _scaler(kube, port).step(now=0) == 3
    assert kube.replicas == 3
    assert (
        "PATCH",
        "/apis/apps/v1/namespaces/gguf-serve/deployments/graviton-moe/scale",
        {"spec": {"replicas": 3}},
    ) in kube.calls
    assert all(sel == SELECTOR for verb, path, sel in kube.calls if verb == "GET" and path.endswith("/pods"))


def test_shed_counts_only_the_increase_between_steps(cluster):
    kube, pods, port = cluster
    pods[0].shed = 50  # shed before the scaler started: not this step's overload
    scaler = _scaler(kube, port)
    assert scaler.step(now=0) == 2
    pods[0].shed = 51
    assert scaler.step(now=15) == 3


def test_scale_in_marks_the_least_busy_pod_to_go_first(cluster):
    kube, pods, port = cluster
    pods[0].processing = 1
    scaler = _scaler(kube, port)
    for t in (0, 150, 301):
        target = scaler.step(now=t)
    assert target == 1 and kube.replicas == 1
    costs = {p["metadata"]["name"]: p["metadata"]["annotations"].get(DELETION_COST) for p in kube.pods}
    assert costs["serving-0"] == "1" and costs["serving-1"] == "0"


class _Eks:
    def describe_nodegroup(self, clusterName: str, nodegroupName: str) -> dict:  # noqa: N803
        return {"nodegroup": {"resources": {"autoScalingGroups": [{"name": "eks-ng-1234"}]}}}


@pytest.fixture
def group():
    with mock_aws():
        asg = boto3.client("autoscaling", region_name="cn-northwest-1")
        ec2 = boto3.client("ec2", region_name="cn-northwest-1")
        template = ec2.create_launch_template(
            LaunchTemplateName="serving-nodes",
            LaunchTemplateData={"ImageId": "ami-12345678", "InstanceType": "c8g.4xlarge"},
        )["LaunchTemplate"]["LaunchTemplateId"]
        asg.create_auto_scaling_group(
            AutoScalingGroupName="eks-ng-1234", MinSize=1, MaxSize=5, DesiredCapacity=2,
            LaunchTemplate={"LaunchTemplateId": template}, AvailabilityZones=["cn-northwest-1a"],
        )  # fmt: skip
        clients = {"autoscaling": asg, "eks": _Eks()}
        yield asg, NodeGroup("EksServingStack", "ng", clients.__getitem__)


def test_nodes_follow_pods_out_and_in_and_a_serving_node_is_never_taken(cluster, group):
    kube, pods, port = cluster
    asg, nodes = group
    pods[0].processing, pods[0].deferred = 2, 1
    scaler = _scaler(kube, port, nodes)
    assert scaler.step(now=time.time()) == 3
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 3
    # Later, quiet: the Deployment goes to one pod; serving-1's pod has gone, its node holds nothing of ours.
    instances = [i["InstanceId"] for i in asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]]
    kube.nodes = []
    for i, instance in enumerate(instances):
        kube.add_node(f"node-{i}", instance, "2026-01-01T00:00:00Z", {"eks.amazonaws.com/nodegroup": "ng"})
    kube.pods = [p for p in kube.pods if p["metadata"]["name"] != "serving-1"]
    pods[0].processing = pods[0].deferred = 0
    kube.replicas = 1
    scaler.step(now=time.time() + 400)
    group_after = asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]
    assert group_after["DesiredCapacity"] == 2  # one node removed, with the desired capacity
    left = {i["InstanceId"] for i in group_after["Instances"] if i["LifecycleState"] == "InService"}
    assert instances[0] in left, "node-0 still serves serving-0: it must stay"


def test_a_node_whose_pod_is_still_draining_is_not_taken_and_a_surge_pod_gets_a_node(cluster, group):
    kube, pods, port = cluster
    asg, nodes = group
    scaler = _scaler(kube, port, nodes)
    instances = [i["InstanceId"] for i in asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"]]
    kube.nodes = []
    for i, instance in enumerate(instances):
        kube.add_node(f"node-{i}", instance, "2026-01-01T00:00:00Z", {"eks.amazonaws.com/nodegroup": "ng"})
    kube.pods[1]["metadata"]["deletionTimestamp"] = "2026-12-01T00:00:00Z"  # serving-1 drains on node-1
    kube.replicas = 1
    asg.set_desired_capacity(AutoScalingGroupName="eks-ng-1234", DesiredCapacity=2)
    scaler.step(now=time.time())
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 2  # nothing taken
    # A rollout: a new pod, not yet scheduled, beside serving-0; the group grows for it (up to its maximum).
    kube.pods[1]["metadata"].pop("deletionTimestamp")
    kube.add_pod("serving-surge", "", "", ready=False, labels=LABELS)
    kube.pods[-1]["status"].pop("podIP")
    kube.replicas = 2
    scaler.step(now=time.time())
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 3


def test_with_an_on_demand_floor_the_spot_group_holds_only_the_pods_above_it(cluster, group):
    """Spot on EKS (stacks/eks/nodes.py): the floor's node holds one pod; three wanted grow the Spot group to two."""
    from dataclasses import replace

    kube, pods, port = cluster
    asg, nodes = group
    asg.update_auto_scaling_group(AutoScalingGroupName="eks-ng-1234", MinSize=0, DesiredCapacity=0)
    pods[0].processing, pods[0].deferred = 2, 1
    scaler = replace(_scaler(kube, port, nodes), fixed_nodes=1)
    assert scaler.step(now=time.time()) == 3
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 2
    without = replace(_scaler(kube, port, nodes), fixed_nodes=0)  # negative control: no floor counted
    pods[0].processing = pods[0].deferred = 0  # quiet: the three pods stay (the scale-in window), none added
    kube.replicas = 3
    without.step(now=time.time())
    assert asg.describe_auto_scaling_groups()["AutoScalingGroups"][0]["DesiredCapacity"] == 3


def test_a_pod_on_a_cordoned_node_is_replaced_before_it_goes(cluster):
    """kubectl drain (or a node group upgrade) cordons node-0: the scaler adds a replica, waits while the replacement
    is not ready, then takes the replica back with serving-0 marked to go first (the disruption budget holds the
    drain's eviction meanwhile). Without the cordon, nothing changes."""
    from dataclasses import replace

    from gguf_serve.container.kube.scaler import GO_FIRST

    kube, pods, port = cluster
    for node in kube.nodes:
        node["metadata"]["labels"]["gguf-serve/profile"] = "graviton-moe"
    scaler = replace(_scaler(kube, port), profile_nodes="gguf-serve/profile=graviton-moe")
    assert scaler.step(now=time.time()) == 2 and kube.replicas == 2  # negative control: no cordon, no move
    kube.nodes[0]["spec"]["unschedulable"] = True
    assert scaler.step(now=time.time()) == 3 and kube.replicas == 3  # a replacement first
    kube.add_pod("serving-new", "127.0.0.4", "node-2", ready=False, labels=LABELS)
    assert scaler.step(now=time.time()) == 3  # not ready yet: serving-0 stays
    kube.pods[-1]["status"]["conditions"][0]["status"] = "True"
    assert scaler.step(now=time.time()) == 2 and kube.replicas == 2  # ready: the added replica goes back
    costs = {p["metadata"]["name"]: p["metadata"]["annotations"].get(DELETION_COST) for p in kube.pods}
    assert costs["serving-0"] == GO_FIRST and costs["serving-1"] != GO_FIRST  # the cordoned pod goes first


def test_each_step_feeds_the_profiles_usage_and_an_interval_publishes_it(cluster):
    """The live cost's inputs from the scrapes the scaling makes anyway: every node of the profile (node-9 is another
    team's, not counted), the pods' output tokens since the step before, their busy slots."""
    from dataclasses import replace

    from gguf_serve.container.kube.usage import FleetUsage
    from gguf_serve.container.metrics import names

    kube, pods, port = cluster
    for node in kube.nodes:
        node["metadata"]["labels"]["gguf-serve/profile"] = "graviton-moe"
    kube.add_node("node-9", "i-00000000000000009", "2026-01-01T00:00:00Z", {"gguf-serve/profile": "other"})
    calls: list[dict] = []
    usage = FleetUsage(lambda **kw: calls.append(kw), "EksServingStack/graviton-moe", slots=POLICY.slots)
    scaler = replace(_scaler(kube, port), profile_nodes="gguf-serve/profile=graviton-moe", usage=usage)
    pods[0].tokens, pods[1].tokens = 500, 100
    scaler.step(now=0)
    pods[0].tokens, pods[1].tokens, pods[0].processing = 900, 160, 1
    scaler.step(now=60)
    [call] = calls
    values = {d["MetricName"]: d["Value"] for d in call["MetricData"]}
    assert values[names.OUTPUT_TOKENS] == 400 + 60
    assert values[names.SERVING_NODES] == 2
    assert values[names.SLOTS_BUSY_RATIO] == pytest.approx((0 + 25) / 2)  # 1 busy of 4 slots at the second step
