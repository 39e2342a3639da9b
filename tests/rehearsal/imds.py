"""An IMDSv2 stand-in: the paths the boot script, the SDKs, the awslogs driver and cloud-init's stand-in read.

Token first (PUT /latest/api/token with a TTL header, refused when forwarded, as EC2 does), then every GET needs
it. Answers instance-id, placement, the instance's tags (the Auto Scaling group name), the role's credentials
and the user data, and the notices a test sets (Spot interruption, rebalance, target lifecycle state; absent
items answer 404, as EC2's do until there is a notice). Every request is recorded.
"""

from __future__ import annotations

import datetime
import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROLE_ACCESS_KEY = "ASIAREHEARSAL0000001"  # every instance's role credentials: what the recorder sees them sign


@dataclass
class Instance:
    instance_id: str
    group: str
    region: str
    role: str
    user_data: str
    hostname: str = "ip-10-0-1-23.cn-northwest-1.compute.internal"
    tags: dict[str, str] = field(default_factory=dict)
    # Items a test sets while the instance runs, as EC2 would: "meta-data/spot/instance-action",
    # "meta-data/events/recommendations/rebalance", "meta-data/autoscaling/target-lifecycle-state"
    notices: dict[str, str] = field(default_factory=dict)

    def metadata(self) -> dict[str, str]:
        now = datetime.datetime.now(datetime.UTC)
        credentials = {
            "Code": "Success",
            "LastUpdated": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "Type": "AWS-HMAC",
            "AccessKeyId": ROLE_ACCESS_KEY,
            "SecretAccessKey": "rehearsal-secret-key",  # moto accepts any signature
            "Token": "rehearsal-session-token",
            "Expiration": (now + datetime.timedelta(hours=6)).strftime("%Y-%m-%dT%H:%M:%SZ"),
        }
        tags = {"aws:autoscaling:groupName": self.group, **self.tags}
        zone = f"{self.region}a"
        document = {
            "instanceId": self.instance_id,
            "region": self.region,
            "availabilityZone": zone,
            "accountId": "123456789012",
            "instanceType": "c8i.4xlarge",
            "imageId": "ami-0123456789abcdef0",
        }
        return {
            "meta-data/instance-id": self.instance_id,
            "meta-data/hostname": self.hostname,
            "meta-data/local-hostname": self.hostname,
            "meta-data/local-ipv4": "10.0.1.23",
            "meta-data/instance-type": "c8i.4xlarge",
            "meta-data/placement/region": self.region,
            "meta-data/placement/availability-zone": zone,
            "meta-data/tags/instance": "\n".join(tags),
            **{f"meta-data/tags/instance/{k}": v for k, v in tags.items()},
            "meta-data/iam/info": json.dumps(
                {"Code": "Success", "InstanceProfileArn": f"arn:aws-cn:iam::123456789012:instance-profile/{self.role}"}
            ),  # fmt: skip
            "meta-data/iam/security-credentials/": self.role,
            f"meta-data/iam/security-credentials/{self.role}": json.dumps(credentials),
            "dynamic/instance-identity/document": json.dumps(document),
            "user-data": self.user_data,
            **self.notices,
        }


class Imds:
    """One instance's metadata service on 127.0.0.1 (a netns.Forward puts it at 169.254.169.254:80)."""

    def __init__(self, instance: Instance) -> None:
        self.instance = instance
        self.requests: list[tuple[str, str, int]] = []  # (method, path, status)
        self._tokens: dict[str, float] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _issue(self, ttl: int) -> str:
        token = secrets.token_urlsafe(32)
        with self._lock:
            self._tokens[token] = time.monotonic() + ttl
        return token

    def _valid(self, token: str | None) -> bool:
        with self._lock:
            return token is not None and self._tokens.get(token, 0) > time.monotonic()

    def _record(self, method: str, path: str, status: int) -> None:
        with self._lock:
            self.requests.append((method, path, status))


def _handler(imds: Imds) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's name
            pass

        def _answer(self, status: int, body: str = "", ttl: int | None = None) -> None:
            data = body.encode()
            imds._record(self.command, self.path, status)
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            if ttl is not None:  # EC2 echoes the token's TTL; the Go SDK (the awslogs driver) requires it
                self.send_header("X-Aws-Ec2-Metadata-Token-Ttl-Seconds", str(ttl))
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def do_PUT(self) -> None:  # noqa: N802 - http.server's naming
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            if self.path != "/latest/api/token":
                return self._answer(404)
            if self.headers.get("X-Forwarded-For"):
                return self._answer(403)  # EC2 refuses tokens through a proxy
            try:
                ttl = int(self.headers.get("X-aws-ec2-metadata-token-ttl-seconds", ""))
            except ValueError:
                return self._answer(400)
            if not 1 <= ttl <= 21600:
                return self._answer(400)
            self._answer(200, imds._issue(ttl), ttl=ttl)

        def do_GET(self) -> None:  # noqa: N802
            if not self._valid_token():
                return self._answer(401)
            path = self.path.split("?", 1)[0]
            if not path.startswith("/latest/"):
                return self._answer(404)
            answers = imds.instance.metadata()
            key = path.removeprefix("/latest/")
            if key in answers:
                return self._answer(200, answers[key])
            self._answer(404)

        do_HEAD = do_GET  # noqa: N815

        def _valid_token(self) -> bool:
            return imds._valid(self.headers.get("X-aws-ec2-metadata-token"))

    return Handler
