"""A serving pod's node in its load balancer's target group: out before the pod stops answering, back when it starts.

On EKS each profile's ALB sends to its nodes on the Service's NodePort (instance targets, externalTrafficPolicy
Local: a node answers for its own pod only). When a pod goes (scale-in, kubectl drain, a node group upgrade), its hop
drains: new requests get 503 and /health 503, and the load balancer would go on sending new requests to that node
until its health checks fail (the unhealthy threshold times the interval: tens of seconds of 503s). So the pod's
preStop hook first deregisters its node (DeregisterTargets: a deregistering target gets no new requests and its
in-flight ones finish within the deregistration delay, Elastic Load Balancing User Guide for Application Load
Balancers, "Deregistration delay", docs.amazonaws.cn), waits a few seconds for that to reach the load balancer's
nodes, and only then drains. Its postStart hook registers the node again (a container restarted on the same node).

The node's instance id comes from its private IP (the downward API's status.hostIP) through DescribeInstances: a pod
cannot reach the instance metadata (one hop: stacks/eks/nodes.py). Every call is bounded in time, and a failure is
one line in the log, never a failed hook: a failed preStop would only lose the early deregistration (the health
checks still take the node out), a failed postStart would kill the container.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gguf-serve-kube")

HOST_IP_ENV = "HOST_IP"  # the node's private IP, from the downward API (status.hostIP): stacks/eks/manifests.py
SETTLE_S = 5.0  # after DeregisterTargets, before the drain refuses new requests: the load balancer's nodes catch up


def instance_of(ec2: Any, host_ip: str) -> str:
    """The instance whose private IP is `host_ip` (EC2 API Reference, DescribeInstances, filter private-ip-address)."""
    found = [
        i["InstanceId"]
        for r in ec2.describe_instances(Filters=[{"Name": "private-ip-address", "Values": [host_ip]}])["Reservations"]
        for i in r["Instances"]
    ]
    if len(found) != 1:
        raise LookupError(f"{len(found)} instances have the private IP {host_ip}")
    return found[0]


def move(
    action: str, *, target_group: str, port: int, host_ip: str, clients: Callable[[str], Any]
) -> str | None:  # fmt: skip
    """Register (`join`) or deregister (`leave`) the node at `host_ip` on `port`; the instance id, or None (logged)."""
    try:
        instance = instance_of(clients("ec2"), host_ip)
        call = {"join": "register_targets", "leave": "deregister_targets"}[action]
        getattr(clients("elbv2"), call)(TargetGroupArn=target_group, Targets=[{"Id": instance, "Port": port}])
    except Exception as e:  # noqa: BLE001 - any failure is one line: the hook must not fail the pod
        log.warning("%s %s: could not %s the target group: %s: %s", action, host_ip, action, type(e).__name__, e)
        return None
    log.info("%s: node %s (%s) port %d %s", action, host_ip, instance, port, "registered" if action == "join" else
             "deregistered: no new request reaches it")  # fmt: skip
    return instance


def clients_for(region: str | None, timeout_s: float = 5.0) -> Callable[[str], Any]:
    """boto3 clients with short timeouts and few retries: a hook has a budget (the grace period), not minutes."""
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=timeout_s, read_timeout=timeout_s, retries={"mode": "standard", "max_attempts": 2})
    made: dict[str, Any] = {}
    return lambda service: made.setdefault(service, boto3.client(service, region_name=region, config=config))


def settle(seconds: float = SETTLE_S) -> None:
    time.sleep(seconds)
