"""A stand-in for the few Kubernetes API paths the scaler calls, over real HTTP on loopback, with the API's shapes:
a PodList and NodeList (labelSelector filtered), the Deployment's Scale subresource (GET, merge PATCH), a pod's merge
PATCH of metadata.annotations. Everything it was asked is in `calls`."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class KubeStandIn(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.pods: list[dict[str, Any]] = []
        self.nodes: list[dict[str, Any]] = []
        self.replicas = 1
        self.calls: list[tuple[str, str, Any]] = []
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()  # shutdown waits a poll

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def add_pod(self, name: str, ip: str, node: str, *, ready: bool = True, labels: dict | None = None) -> None:
        self.pods.append(
            {
                "metadata": {"name": name, "labels": labels or {}, "annotations": {}},
                "spec": {"nodeName": node},
                "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
            }
        )

    def add_node(self, name: str, instance: str, created: str, labels: dict | None = None) -> None:
        self.nodes.append(
            {
                "metadata": {"name": name, "labels": labels or {}, "creationTimestamp": created},
                "spec": {"providerID": f"aws:///cn-northwest-1a/{instance}"},
            }
        )


def _matches(item: dict, selector: str) -> bool:
    wanted = dict(part.split("=", 1) for part in selector.split(",") if part)
    labels = item["metadata"].get("labels", {})
    return all(labels.get(k) == v for k, v in wanted.items())


class _Handler(BaseHTTPRequestHandler):
    server: KubeStandIn

    def log_message(self, *args) -> None:
        pass

    def _answer(self, status: int, doc: Any) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:  # noqa: N802
        url = urllib.parse.urlsplit(self.path)
        selector = urllib.parse.parse_qs(url.query).get("labelSelector", [""])[0]
        self.server.calls.append(("GET", url.path, selector))
        if url.path.endswith("/pods"):
            return self._answer(
                200, {"kind": "PodList", "items": [p for p in self.server.pods if _matches(p, selector)]}
            )
        if url.path == "/api/v1/nodes":
            return self._answer(
                200, {"kind": "NodeList", "items": [n for n in self.server.nodes if _matches(n, selector)]}
            )
        if url.path.endswith("/scale"):
            return self._answer(200, {"kind": "Scale", "spec": {"replicas": self.server.replicas}})
        return self._answer(404, {"kind": "Status", "code": 404})

    def do_PATCH(self) -> None:  # noqa: N802
        if self.headers.get("Content-Type") != "application/merge-patch+json":
            return self._answer(415, {"kind": "Status", "code": 415})
        patch = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.calls.append(("PATCH", self.path, patch))
        if self.path.endswith("/scale"):
            self.server.replicas = patch["spec"]["replicas"]
            return self._answer(200, {"kind": "Scale", "spec": {"replicas": self.server.replicas}})
        name = self.path.rsplit("/", 1)[-1]
        for pod in self.server.pods:
            if pod["metadata"]["name"] == name:
                pod["metadata"]["annotations"].update(patch["metadata"]["annotations"])
                return self._answer(200, pod)
        return self._answer(404, {"kind": "Status", "code": 404})
