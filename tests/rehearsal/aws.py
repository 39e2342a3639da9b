"""AWS behind its own endpoints: moto in server mode, fronted by a recorder that records every call and answers
the ones moto lacks (CloudFormation SignalResource, Auto Scaling CompleteLifecycleAction and
RecordLifecycleActionHeartbeat), checked against what moto holds (the group and its hook exist), as AWS would.

Served on 127.0.0.1 over HTTP (the SDKs and the CLI, through AWS_ENDPOINT_URL) and over TLS with the rehearsal
CA (the awslogs log driver, which reaches CloudWatch Logs by its regional name).
"""

from __future__ import annotations

import io
import ssl
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from werkzeug.serving import make_server

ACCOUNT = "123456789012"  # moto's account


@dataclass(frozen=True)
class Call:
    service: str
    action: str
    params: dict[str, str] = field(default_factory=dict)
    at: float = field(default_factory=time.time)
    key: str = ""  # the access key id that signed it (the instance role's comes from IMDS)
    path: str = ""


class Recorder:
    """WSGI middleware in front of moto's dispatcher."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.calls: list[Call] = []
        self.outages: dict[str, float] = {}  # action -> time.time() until which it answers 500, as AWS can
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        params: dict[str, str] = {}
        action = environ.get("HTTP_X_AMZ_TARGET", "")
        content_type = environ.get("CONTENT_TYPE", "")
        if environ["REQUEST_METHOD"] == "POST" and content_type.startswith("application/x-www-form-urlencoded"):
            body = environ["wsgi.input"].read(int(environ.get("CONTENT_LENGTH") or 0))
            environ["wsgi.input"] = io.BytesIO(body)
            params = {k: v[0] for k, v in parse_qs(body.decode()).items()}
            action = params.get("Action", action)
        if not action:
            action = f"{environ['REQUEST_METHOD']} {environ.get('PATH_INFO', '')}"
        service, key = _signer(environ)
        with self._lock:
            self.calls.append(Call(service, action, params, key=key, path=environ.get("PATH_INFO", "")))
            outage = any(action.endswith(a) and until > time.time() for a, until in self.outages.items())
        if outage:
            body = b'{"__type": "InternalServiceError", "message": "rehearsed outage"}'
            start_response("500 Internal Server Error", [("Content-Type", "application/x-amz-json-1.1")])
            return [body]
        if action == "SignalResource":
            return _query_answer(start_response, "SignalResource", _cloudformation_ns, None)
        if action in ("CompleteLifecycleAction", "RecordLifecycleActionHeartbeat"):
            return _query_answer(start_response, action, _autoscaling_ns, _check_lifecycle_action(action, params))
        return self.app(environ, start_response)

    def of(self, action: str, **params: str) -> list[Call]:
        """Calls of an action (query-protocol name, JSON target suffix or "METHOD /path"), matching params."""
        with self._lock:
            calls = [c for c in self.calls if c.action == action or c.action.endswith(f".{action}")]
        return [c for c in calls if all(c.params.get(k) == v for k, v in params.items())]


_cloudformation_ns = "http://cloudformation.amazonaws.com/doc/2010-05-15/"
_autoscaling_ns = "http://autoscaling.amazonaws.com/doc/2011-01-01/"


def _signer(environ: dict[str, Any]) -> tuple[str, str]:
    """(service, access key id) from the SigV4 credential scope: Credential=AKID/date/region/service/aws4_request."""
    auth = environ.get("HTTP_AUTHORIZATION", "")
    parts = auth.split("Credential=", 1)[-1].split(",", 1)[0].split("/")
    return (parts[3], parts[0]) if len(parts) > 3 else ("?", "")


_IAM_PREFIX = {"monitoring": "cloudwatch"}


def iam_action(call: Call) -> str:
    """The IAM action a recorded call needs: query and JSON protocols by name, S3's REST calls by method."""
    prefix = _IAM_PREFIX.get(call.service, call.service)
    if call.service == "s3":
        method, _, path = call.action.partition(" ")
        if path.count("/") < 2:
            return "s3:ListBucket"
        return {"DELETE": "s3:AbortMultipartUpload", "PUT": "s3:PutObject", "POST": "s3:PutObject"}.get(
            method, "s3:GetObject"
        )
    return f"{prefix}:{call.action.rsplit('.', 1)[-1]}"


def _check_lifecycle_action(action: str, params: dict[str, str]) -> str | None:
    from moto.autoscaling.models import autoscaling_backends

    region = "cn-northwest-1"
    backend = autoscaling_backends[ACCOUNT][region]
    group, hook = params.get("AutoScalingGroupName", ""), params.get("LifecycleHookName", "")
    if group not in backend.autoscaling_groups:
        return f"Group {group} not found"
    if f"{group}_{hook}" not in backend.lifecycle_hooks:
        return f"No Lifecycle Hook found with name {hook} for group {group}"
    if action == "CompleteLifecycleAction" and params.get("LifecycleActionResult") not in ("CONTINUE", "ABANDON"):
        return "LifecycleActionResult must be CONTINUE or ABANDON"
    if not params.get("InstanceId") and not params.get("LifecycleActionToken"):
        return "InstanceId or LifecycleActionToken is required"
    return None


def _query_answer(start_response: Any, action: str, namespace: str, error: str | None) -> list[bytes]:
    request_id = str(uuid.uuid4())
    if error:
        body = (
            f'<ErrorResponse xmlns="{namespace}"><Error><Type>Sender</Type><Code>ValidationError</Code>'
            f"<Message>{error}</Message></Error><RequestId>{request_id}</RequestId></ErrorResponse>"
        )
        status = "400 Bad Request"
    else:
        body = (
            f'<{action}Response xmlns="{namespace}"><{action}Result/>'
            f"<ResponseMetadata><RequestId>{request_id}</RequestId></ResponseMetadata></{action}Response>"
        )
        status = "200 OK"
    data = body.encode()
    start_response(status, [("Content-Type", "text/xml"), ("Content-Length", str(len(data)))])
    return [data]


class AwsStandIn:
    """moto + recorder on two loopback ports: `http_port` and `https_port` (certificate for `tls_names`)."""

    def __init__(self, certificate: tuple[Path, Path]) -> None:
        from moto.moto_server.werkzeug_app import (
            DomainDispatcherApplication,
            MotoRequestHandler,
            create_backend_app,
        )

        from tests.rehearsal.objectstore import ObjectFiles

        # Model-sized objects are served from files (a real-size boot); every other call reaches moto.
        self.objects = ObjectFiles(DomainDispatcherApplication(create_backend_app))
        self.recorder = Recorder(self.objects)
        self._http = make_server("127.0.0.1", 0, self.recorder, threaded=True, request_handler=MotoRequestHandler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*certificate)
        self._https = make_server(
            "127.0.0.1", 0, self.recorder, threaded=True, request_handler=MotoRequestHandler, ssl_context=context
        )
        self.http_port = self._http.server_port
        self.https_port = self._https.server_port
        for server in (self._http, self._https):
            threading.Thread(target=server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def client(self, service: str):  # noqa: ANN201 - a boto3 client
        import boto3

        return boto3.client(
            service,
            region_name="cn-northwest-1",
            endpoint_url=self.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",  # noqa: S106 - moto's
        )

    def close(self) -> None:
        for server in (self._http, self._https):
            server.shutdown()
            server.server_close()
