"""A stand-in for the Kubernetes API server's discovery documents, so that the packaged kubectl can run a client-side
dry run (`kubectl apply --dry-run=client` maps each object's kind to a resource through discovery even when it sends
nothing). Real shapes: APIVersions at /api, APIGroupList at /apis, APIResourceList per group version. Only the kinds
the stack applies are listed; anything else is a 404, as for a kind the server does not serve."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# group version -> (resource, kind, namespaced)
RESOURCES = {
    "v1": [
        ("namespaces", "Namespace", False),
        ("configmaps", "ConfigMap", True),
        ("services", "Service", True),
        ("serviceaccounts", "ServiceAccount", True),
        ("nodes", "Node", False),
        ("pods", "Pod", True),
    ],
    "apps/v1": [("deployments", "Deployment", True)],
    "policy/v1": [("poddisruptionbudgets", "PodDisruptionBudget", True)],
    "admissionregistration.k8s.io/v1": [
        ("validatingadmissionpolicies", "ValidatingAdmissionPolicy", False),
        ("validatingadmissionpolicybindings", "ValidatingAdmissionPolicyBinding", False),
    ],
    "rbac.authorization.k8s.io/v1": [
        ("roles", "Role", True),
        ("rolebindings", "RoleBinding", True),
        ("clusterroles", "ClusterRole", False),
        ("clusterrolebindings", "ClusterRoleBinding", False),
    ],
}
VERBS = ["create", "delete", "get", "list", "patch", "update", "watch"]


def _documents() -> dict[str, dict]:
    docs: dict[str, dict] = {"/api": {"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}}
    groups = []
    for gv, resources in RESOURCES.items():
        path = "/api/v1" if gv == "v1" else f"/apis/{gv}"
        docs[path] = {
            "kind": "APIResourceList",
            "apiVersion": "v1",
            "groupVersion": gv,
            "resources": [
                {"name": n, "singularName": k.lower(), "namespaced": ns, "kind": k, "verbs": VERBS}
                for n, k, ns in resources
            ],
        }
        if gv != "v1":
            group, version = gv.split("/")
            entry = {"groupVersion": gv, "version": version}
            groups.append({"name": group, "versions": [entry], "preferredVersion": entry})
    docs["/apis"] = {"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}
    return docs


class Discovery(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        self.documents = _documents()
        self.asked: list[str] = []
        super().__init__(("127.0.0.1", 0), _Handler)
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()  # shutdown waits a poll

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _Handler(BaseHTTPRequestHandler):
    server: Discovery

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        path = self.path.split("?", 1)[0]
        self.server.asked.append(path)
        doc = self.server.documents.get(path)
        body = json.dumps(doc or {"kind": "Status", "code": 404}).encode()
        self.send_response(200 if doc else 404)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
