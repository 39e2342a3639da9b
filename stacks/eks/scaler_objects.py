"""The scaler of one serving profile as Kubernetes objects: its RBAC and its Deployment (on the system nodes).

It reads the serving pods and their hop's /metrics, sets the Deployment's scale and a pod's deletion cost, lists the
node group's nodes (gguf_serve/container/kube/scaler.py), and publishes the profile's usage for the live cost
(gguf_serve/container/kube/usage.py). Its AWS calls (the node group's Auto Scaling group, PutMetricData) go through
its own IAM role (stacks/eks/stack.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stacks.eks.cluster import ARCH_LABEL, SYSTEM_LABEL
from stacks.eks.manifests import APP, KEY_FILE, POD_TMP, RUN_VOLUME, labels, region_env
from stacks.eks.workload import NAMESPACE, PROFILE_LABEL, ServingWorkload


@dataclass(frozen=True)
class ScalerDeploy:
    image: str  # the control image (stacks/eks/cluster.py control_target): the system nodes run its architecture
    architecture: str  # kubernetes.io/arch of that image
    region: str
    api_key_secret_arn: str
    service_account: str  # IRSA: the secret, eks:DescribeNodegroup, the Auto Scaling group
    cluster: str
    nodegroup: str  # the group the scaler sizes (on Spot: the Spot group)
    fixed_nodes: int = 0  # nodes of the profile outside that group (on Spot: the On-Demand floor)
    usage_profile: str = ""  # EksProfile dimension of what it publishes for the live cost (none: nothing published)


def scaler_name(w: ServingWorkload) -> str:
    return f"{w.name}-scaler"


def scaler_objects(w: ServingWorkload, d: ScalerDeploy) -> list[dict[str, Any]]:
    name = scaler_name(w)
    meta = {"labels": {APP: "gguf-serve-scaler", PROFILE_LABEL: w.name}}
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": name, "namespace": NAMESPACE, **meta},
        "rules": [
            {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "patch"]},
            {
                "apiGroups": ["apps"],
                "resources": ["deployments/scale"],
                "resourceNames": [w.name],
                "verbs": ["get", "patch"],
            },
        ],
    }
    nodes = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRole",
        "metadata": {"name": f"gguf-serve-{name}-nodes", **meta},
        "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}],
    }
    subject = [{"kind": "ServiceAccount", "name": d.service_account, "namespace": NAMESPACE}]
    binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": name, "namespace": NAMESPACE, **meta},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": subject,
    }
    node_binding = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "ClusterRoleBinding",
        "metadata": {"name": f"gguf-serve-{name}-nodes", **meta},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": nodes["metadata"]["name"]},
        "subjects": subject,
    }
    return [role, nodes, binding, node_binding, _deployment(w, d, meta["labels"])]


def _deployment(w: ServingWorkload, d: ScalerDeploy, selector: dict[str, str]) -> dict[str, Any]:
    selector_text = ",".join(f"{k}={v}" for k, v in labels(w).items())
    scale = ["python3", "-m", "gguf_serve.container.kube", "scale", "--namespace", NAMESPACE, "--deployment", w.name]
    scale += ["--selector", selector_text, "--port", str(w.port), "--slots", str(w.slots)]
    scale += ["--min", str(w.min_replicas), "--max", str(w.max_replicas)]
    scale += ["--target-busy-ratio", str(w.target_busy_ratio), "--deferred-step", str(w.deferred_step)]
    scale += ["--key-file", KEY_FILE, "--cluster", d.cluster, "--nodegroup", d.nodegroup, "--region", d.region]
    scale += ["--fixed-nodes", str(d.fixed_nodes)] if d.fixed_nodes else []
    scale += ["--profile-nodes", f"{PROFILE_LABEL}={w.name}"]  # a pod on a cordoned node is replaced first
    scale += ["--usage-profile", d.usage_profile] if d.usage_profile else []  # its nodes, tokens, busy slots
    hardened = {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    env = region_env(d.region) + [{"name": "HOME", "value": POD_TMP}]
    mounts = [{"name": "run", "mountPath": RUN_VOLUME}, {"name": "tmp", "mountPath": POD_TMP}]
    key = ["python3", "-m", "gguf_serve.container.kube", "api-key", "--secret-id", d.api_key_secret_arn]
    pod = {
        "serviceAccountName": d.service_account,
        # The system nodes only (untainted, labelled), and only where the image runs: a selector, so the pod waits
        # Pending rather than land on a node that cannot execute it.
        "nodeSelector": {**SYSTEM_LABEL, ARCH_LABEL: d.architecture},
        "securityContext": {"runAsNonRoot": True, "runAsUser": 10001, "seccompProfile": {"type": "RuntimeDefault"}},
        "initContainers": [
            {
                "name": "api-key",
                "image": d.image,
                "command": [*key, "--out", KEY_FILE, "--region", d.region],
                "env": env,
                "volumeMounts": mounts,
                "securityContext": hardened,
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            }
        ],
        "containers": [
            {
                "name": "scaler",
                "image": d.image,
                "command": scale,
                "env": env,
                "volumeMounts": mounts,
                "securityContext": hardened,
                "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
            }
        ],
        "volumes": [
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "16Mi"}},
        ],
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": scaler_name(w), "namespace": NAMESPACE, "labels": selector},
        "spec": {
            "replicas": 1,
            "strategy": {"type": "Recreate"},  # never two scalers setting the same scale
            "selector": {"matchLabels": selector},
            "template": {"metadata": {"labels": selector}, "spec": pod},
        },
    }
