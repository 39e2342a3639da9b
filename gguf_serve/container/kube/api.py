"""The few Kubernetes API calls the scaler makes, with the pod's service account, over the standard library.

In a pod the API server is at https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT, the service account's
token and the cluster's CA are mounted under SERVICE_ACCOUNT (Kubernetes docs, "Accessing the Kubernetes API from a
Pod"). The token is read again for every call: the kubelet rotates projected tokens.
"""

from __future__ import annotations

import json
import os
import ssl
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SERVICE_ACCOUNT = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TIMEOUT_S = 10.0
MERGE_PATCH = "application/merge-patch+json"


class KubeError(Exception):
    """An API call that failed; the message names the call and the status."""


@dataclass(frozen=True)
class Pod:
    name: str
    ip: str | None
    node: str | None
    ready: bool
    deleting: bool


@dataclass(frozen=True)
class Node:
    name: str
    instance_id: str | None  # from spec.providerID, aws:///<zone>/<instance id>
    created: str  # metadata.creationTimestamp (RFC 3339)
    unschedulable: bool = False  # spec.unschedulable: cordoned (kubectl drain, a node group upgrade)


class KubeApi:
    def __init__(self, base_url: str, *, token_file: Path | None, ca_file: Path | None) -> None:
        self.base_url = base_url.rstrip("/")
        self.token_file = token_file
        self.context = ssl.create_default_context(cafile=str(ca_file)) if ca_file else None

    @classmethod
    def in_cluster(cls) -> KubeApi:
        host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT", "443")
        if not host:
            raise KubeError("KUBERNETES_SERVICE_HOST is not set: the scaler runs in a pod (or pass --api-server)")
        host = f"[{host}]" if ":" in host else host
        return cls(f"https://{host}:{port}", token_file=SERVICE_ACCOUNT / "token", ca_file=SERVICE_ACCOUNT / "ca.crt")

    def call(self, method: str, path: str, body: Any = None, content_type: str = "application/json") -> Any:
        headers = {"Accept": "application/json"}
        if self.token_file is not None:
            headers["Authorization"] = f"Bearer {self.token_file.read_text().strip()}"
        data = None
        if body is not None:
            data, headers["Content-Type"] = json.dumps(body).encode(), content_type
        request = urllib.request.Request(self.base_url + path, data=data, method=method, headers=headers)  # noqa: S310
        try:
            with urllib.request.urlopen(request, timeout=TIMEOUT_S, context=self.context) as answer:  # noqa: S310
                return json.loads(answer.read() or b"null")
        except urllib.error.HTTPError as e:
            raise KubeError(f"{method} {path}: HTTP {e.code} {e.read(512).decode('utf-8', 'replace')}") from None
        except (urllib.error.URLError, OSError, ValueError) as e:
            raise KubeError(f"{method} {path}: {getattr(e, 'reason', e)}") from None

    def pods(self, namespace: str, selector: str) -> list[Pod]:
        query = urllib.parse.urlencode({"labelSelector": selector})
        items = self.call("GET", f"/api/v1/namespaces/{namespace}/pods?{query}")["items"]
        return [_pod(item) for item in items]

    def nodes(self, selector: str) -> list[Node]:
        query = urllib.parse.urlencode({"labelSelector": selector})
        items = self.call("GET", f"/api/v1/nodes?{query}")["items"]
        return [_node(item) for item in items]

    def replicas(self, namespace: str, deployment: str) -> int:
        scale = self.call("GET", f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale")
        return int(scale["spec"].get("replicas", 0))

    def scale(self, namespace: str, deployment: str, replicas: int) -> None:
        path = f"/apis/apps/v1/namespaces/{namespace}/deployments/{deployment}/scale"
        self.call("PATCH", path, {"spec": {"replicas": replicas}}, MERGE_PATCH)

    def annotate(self, namespace: str, pod: str, annotations: dict[str, str]) -> None:
        self.call(
            "PATCH",
            f"/api/v1/namespaces/{namespace}/pods/{pod}",
            {"metadata": {"annotations": annotations}},
            MERGE_PATCH,
        )


def _pod(item: dict[str, Any]) -> Pod:
    status = item.get("status", {})
    conditions = {c.get("type"): c.get("status") for c in status.get("conditions", [])}
    meta = item.get("metadata", {})
    return Pod(
        name=meta["name"],
        ip=status.get("podIP"),
        node=item.get("spec", {}).get("nodeName"),
        ready=conditions.get("Ready") == "True",
        deleting=bool(meta.get("deletionTimestamp")),
    )


def _node(item: dict[str, Any]) -> Node:
    provider = item.get("spec", {}).get("providerID", "")
    instance = provider.rsplit("/", 1)[-1] if provider.startswith("aws://") else None
    meta = item["metadata"]
    return Node(
        name=meta["name"], instance_id=instance or None, created=meta.get("creationTimestamp", ""),
        unschedulable=bool(item.get("spec", {}).get("unschedulable")),
    )  # fmt: skip
