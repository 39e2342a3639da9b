"""The Kubernetes objects of one serving profile, as plain dicts (CDK applies them; tests validate them strictly).

Pod shape (one pod per node: it asks for the node's CPUs and memory):
- init `api-key`: the API key from Secrets Manager onto a memory volume (gguf_serve/container/kube/apikey.py);
- init `fetch`: the locked GGUF, S3 cache first, then ModelScope, sha256-verified, onto a node-local volume (the
  launcher's `fetch`, as on an instance);
- sidecar `llama` (an init container with restartPolicy Always): llama-server on the pod's loopback, started by the
  launcher with the key; its startup probe holds the hop back until the model is loaded. Sidecars stop after the
  main containers ("Sidecar Containers", Kubernetes docs; stable in 1.33), so llama-server outlives the drain;
- `hop`: the serving port, admission 429, the drain. Its preStop hook drains (gguf_serve/container/hop/pod.py).
Values may be CDK tokens (the image, the secret, the bucket): they pass through untouched.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gguf_serve.container import names
from gguf_serve.container.kube.targets import HOST_IP_ENV
from stacks.eks.cluster import ARCH_LABEL
from stacks.eks.workload import NAMESPACE, PROFILE_LABEL, STARTUP_PERIOD_S, ServingWorkload

RUN_VOLUME = names.RUN_DIR  # memory-backed: the API key and the drain outcome
POD_TMP = "/tmp"  # noqa: S108 - the pod's own emptyDir, writable with a read-only root
KEY_FILE = names.API_KEY_ENV_FILE  # LLAMA_API_KEY=<key>, as on an instance (gguf_serve/container/kube/apikey.py)
DRAIN_FILE = f"{RUN_VOLUME}/drain.json"
APP = "app.kubernetes.io/name"


@dataclass(frozen=True)
class WorkloadDeploy:
    """Deploy-time values (CDK tokens) the manifests read."""

    image: str
    architecture: str  # the image's, as kubernetes.io/arch names it (arm64 | amd64): the pods' node selector
    region: str
    api_key_secret_arn: str
    model_cache_url: str
    service_account: str  # the serving pods' (IRSA: S3 cache, the secret, their node in the target group)
    node_port: int
    target_group_arn: str = ""  # the profile's: the hop's hooks put its node in and take it out before the drain
    # (model name, URL) of the models other profiles serve behind the shared load balancer: the hop forwards there
    routes: tuple[tuple[str, str], ...] = ()


def labels(w: ServingWorkload) -> dict[str, str]:
    return {APP: "gguf-serve", PROFILE_LABEL: w.name}


def serving_objects(w: ServingWorkload, d: WorkloadDeploy) -> list[dict[str, Any]]:
    meta = {"namespace": NAMESPACE, "labels": labels(w)}
    runtime = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": f"{w.name}-runtime", **meta}}
    runtime["data"] = {"runtime.json": w.runtime_json}
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": w.name, **meta},
        "spec": {
            "type": "NodePort",
            "selector": labels(w),
            "ports": [{"name": "http", "port": w.port, "targetPort": "http", "nodePort": d.node_port}],
            # Local: a node answers only for its own pod, so the load balancer's health check of a node is its pod's
            # readiness (a draining pod's /health 503 takes its node out), and no request crosses to another node.
            "externalTrafficPolicy": "Local",
        },
    }
    # A voluntary disruption (kubectl drain, a node group upgrade) may not take the profile under its minimum: the
    # eviction waits until the scaler's replacement serves (gguf_serve/container/kube/scaler.py), then the scaler
    # lets the cordoned pod go itself. maxUnavailable 1 allowed evicting the only pod of a profile at one replica.
    budget = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": w.name, **meta},
        "spec": {"minAvailable": w.min_replicas, "selector": {"matchLabels": labels(w)}},
    }
    return [runtime, deployment(w, d), service, budget]


def deployment(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": w.name, "namespace": NAMESPACE, "labels": labels(w)},
        "spec": {
            "replicas": w.min_replicas,  # the scaler owns it from then on (a re-apply resets it: docs/eks.md)
            "selector": {"matchLabels": labels(w)},
            "progressDeadlineSeconds": w.progress_deadline_s,
            # A new pod (on a new node) loads before an old one drains: capacity never dips during a rollout.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": labels(w)}, "spec": pod_spec(w, d)},
        },
    }


def pod_spec(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    return {
        "serviceAccountName": d.service_account,
        "automountServiceAccountToken": False,  # no Kubernetes API calls; the IAM role's token is mounted apart
        "terminationGracePeriodSeconds": w.grace_s,
        "nodeSelector": {PROFILE_LABEL: w.name, ARCH_LABEL: d.architecture},
        "tolerations": [{"key": PROFILE_LABEL, "operator": "Equal", "value": w.name, "effect": "NoSchedule"}],
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": names.CONTAINER_UID,
            "runAsGroup": names.CONTAINER_UID,
            "fsGroup": names.CONTAINER_UID,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "initContainers": [_api_key(w, d), _fetch(w, d), _llama(w, d)],
        "containers": [_hop(w, d)],
        "volumes": [
            {"name": "models", "emptyDir": {"sizeLimit": f"{w.model_gib}Gi"}},
            {"name": "run", "emptyDir": {"medium": "Memory", "sizeLimit": "1Mi"}},
            {"name": "tmp", "emptyDir": {"sizeLimit": "64Mi"}},
            {"name": "runtime", "configMap": {"name": f"{w.name}-runtime"}},
        ],
    }


def _container(name: str, d: WorkloadDeploy, mounts: list[tuple[str, str, bool]], **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "image": d.image,
        "env": region_env(d.region) + [{"name": "HOME", "value": POD_TMP}],
        "volumeMounts": [{"name": v, "mountPath": path, "readOnly": ro} for v, path, ro in mounts],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
        **extra,
    }


_RUNTIME = ("runtime", names.CONFIG_DIR, True)
_TMP = ("tmp", POD_TMP, False)


def _api_key(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    command = ["python3", "-m", "gguf_serve.container.kube", "api-key", "--secret-id", d.api_key_secret_arn]
    return _container(
        "api-key",
        d,
        [("run", RUN_VOLUME, False), _TMP],
        command=[*command, "--out", KEY_FILE, "--region", d.region],
        resources=_small(),
    )


def _fetch(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    args = ["fetch", "--spec", names.RUNTIME_SPEC_PATH, "--model-dir", names.CONTAINER_MODEL_DIR]
    return _container(
        "fetch",
        d,
        [("models", names.CONTAINER_MODEL_DIR, False), _RUNTIME, _TMP],
        args=[*args, "--s3-cache", d.model_cache_url],
        resources={"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "2Gi"}},
    )


def _llama(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    health = ["python3", "-m", "gguf_serve.container.launch", "health", "--spec", names.RUNTIME_SPEC_PATH]
    serve = ["--spec", names.RUNTIME_SPEC_PATH, "--model-dir", names.CONTAINER_MODEL_DIR]
    resources: dict[str, Any] = {
        "requests": {"cpu": str(w.cpu), "memory": f"{w.memory_gib}Gi", "ephemeral-storage": f"{w.model_gib}Gi"},
        "limits": {"memory": f"{w.memory_gib}Gi"},
    }
    if w.gpu:  # the EKS Bottlerocket NVIDIA AMI advertises nvidia.com/gpu itself (stacks/eks/nodes.py)
        resources["requests"]["nvidia.com/gpu"] = "1"
        resources["limits"]["nvidia.com/gpu"] = "1"
    return _container(
        "llama",
        d,
        [("models", names.CONTAINER_MODEL_DIR, True), ("run", RUN_VOLUME, True), _RUNTIME, _TMP],
        command=["python3", "-m", "gguf_serve.container.kube", "serve", "--key-file", KEY_FILE, "--", *serve],
        restartPolicy="Always",  # a sidecar: starts before the hop, stops after it
        resources=resources,
        # llama-server answers on the pod's loopback only, where the kubelet's HTTP probes cannot reach: exec probes,
        # the image's own bounded health check (gguf_serve/container/launch/health.py).
        startupProbe=_exec_probe(health, STARTUP_PERIOD_S, w.startup_failures),
        livenessProbe=_exec_probe(health, 30, 4),
    )


def _hop(w: ServingWorkload, d: WorkloadDeploy) -> dict[str, Any]:
    hop = ["python3", "-m", "gguf_serve.container.hop", "--listen", f"0.0.0.0:{w.port}"]
    hop += ["--upstream", f"http://127.0.0.1:{names.UPSTREAM_PORT}", "--spec", names.RUNTIME_SPEC_PATH]
    hop += ["--gpu-metrics", "off", "--drain-deadline", str(w.drain_deadline_s), "--pod-drain", DRAIN_FILE]
    hop += ["--api-key-env-file", KEY_FILE]  # the key its init container wrote: keyless requests get 401 at the head
    hop += [a for name, url in d.routes for a in ("--route", f"{name}={url}")]  # another profile's model: onward
    prestop = ["python3", "-m", "gguf_serve.container.hop.pod", "prestop", "--report", DRAIN_FILE]
    prestop += ["--wait", str(w.drain_deadline_s + 10)]
    hooks: dict[str, Any] = {"preStop": {"exec": {"command": prestop}}}
    if d.target_group_arn:  # out of the load balancer before the drain, back in at a start (kube/targets.py)
        lb = ["python3", "-m", "gguf_serve.container.kube"]
        where = ["--target-group", d.target_group_arn, "--port", str(d.node_port), "--region", d.region]
        hooks = {
            "postStart": {"exec": {"command": [*lb, "lb-join", *where]}},
            "preStop": {"exec": {"command": [*lb, "lb-leave", *where, "--", *prestop]}},
        }
    container = _container(
        "hop",
        d,
        [("run", RUN_VOLUME, False), _RUNTIME, _TMP],
        command=hop,
        ports=[{"name": "http", "containerPort": w.port, "protocol": "TCP"}],
        resources={"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "512Mi"}},
        # /health: llama-server's own through the hop, 503 while the pod drains: the pod leaves the Service.
        readinessProbe={
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 5,
            "timeoutSeconds": 2,
            "failureThreshold": 2,
        },
        livenessProbe={"tcpSocket": {"port": "http"}, "periodSeconds": 20, "timeoutSeconds": 5, "failureThreshold": 3},
        lifecycle=hooks,
    )
    # the node's private IP for the hooks (the downward API; a pod cannot read the instance metadata)
    container["env"].append({"name": HOST_IP_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}})
    return container


def region_env(region: str) -> list[dict[str, str]]:
    """Both names: botocore 1.43 (the image's) reads AWS_DEFAULT_REGION only, and a pod cannot fall back on the
    instance metadata's region (one hop: stacks/eks/nodes.py). Without it the fetcher's S3 cache would be skipped."""
    return [{"name": "AWS_REGION", "value": region}, {"name": "AWS_DEFAULT_REGION", "value": region}]


def _exec_probe(command: list[str], period_s: int, failures: int) -> dict[str, Any]:
    return {"exec": {"command": command}, "periodSeconds": period_s, "timeoutSeconds": 8, "failureThreshold": failures}


def _small() -> dict[str, Any]:
    return {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}}
