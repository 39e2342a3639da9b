"""A local SageMaker Runtime: InvokeEndpoint and InvokeEndpointWithResponseStream in their real wire shape, in front of
a container's /invocations, for the benchmark's SageMaker client (moto models neither the stream nor a container).

What it does as SageMaker does (SageMaker Runtime API Reference; the shapes botocore's service model describes):
- checks each request's SigV4 signature (service `sagemaker`, the region) over the request as received;
- forwards only the headers InvokeEndpoint defines (tests/container/sagemaker/harness.py), the custom attributes
  among them, to the container's POST /invocations;
- answers the stream as application/vnd.amazon.eventstream messages: PayloadPart events carrying the container's
  bytes cut at arbitrary points (`split`), a ModelStreamError exception event when the container's stream breaks;
- answers a container error as ModelError (424) with its OriginalStatusCode, an unknown endpoint as a
  ValidationError (400).
"""

from __future__ import annotations

import binascii
import http.client
import json
import random
import struct
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from tests.container.sagemaker.harness import FORWARDED

ACCESS_KEY, SECRET_KEY = "AKIDSAGEMAKERTEST", "secret-for-the-local-runtime"


def event_message(headers: dict[str, str], payload: bytes) -> bytes:
    """One event-stream message: prelude (lengths, CRC), string headers, payload, message CRC."""
    encoded = b"".join(
        struct.pack("B", len(k)) + k.encode() + b"\x07" + struct.pack(">H", len(v)) + v.encode()
        for k, v in headers.items()
    )
    total = 12 + len(encoded) + len(payload) + 4
    prelude = struct.pack(">II", total, len(encoded))
    prelude += struct.pack(">I", binascii.crc32(prelude))
    message = prelude + encoded + payload
    return message + struct.pack(">I", binascii.crc32(message))


def payload_part(data: bytes) -> bytes:
    return event_message(
        {":event-type": "PayloadPart", ":content-type": "application/octet-stream", ":message-type": "event"}, data
    )


def stream_error(message: str) -> bytes:
    return event_message(
        {":exception-type": "ModelStreamError", ":content-type": "application/json", ":message-type": "exception"},
        json.dumps({"Message": message, "ErrorCode": "ModelStreamError"}).encode(),
    )


class Runtime(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, container: str, endpoint_name: str, region: str, split: Callable[[bytes], list[bytes]]):
        self.container = urlsplit(container)
        self.endpoint_name, self.region, self.split = endpoint_name, region, split
        self.seen: list[dict] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"

    def start(self) -> Runtime:
        threading.Thread(target=self.serve_forever, args=(0.05,), daemon=True).start()  # shutdown waits a poll
        return self


def random_split(seed: int = 7, largest: int = 40) -> Callable[[bytes], list[bytes]]:
    rng = random.Random(seed)

    def split(data: bytes) -> list[bytes]:
        parts, at = [], 0
        while at < len(data):
            step = rng.randint(1, largest)
            parts.append(data[at : at + step])
            at += step
        return parts

    return split


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: Runtime

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        name, _, action = self.path.removeprefix("/endpoints/").partition("/")
        signed = self._signature_ok(body)
        self.server.seen.append({"action": action, "signed": signed, "headers": dict(self.headers)})
        if not signed:
            return self._error(403, "InvalidSignatureException", "The request signature we calculated does not match")
        if name != self.server.endpoint_name:
            return self._error(400, "ValidationError", f"Endpoint {name} of account 111122223333 not found.")
        headers = {k: v for k, v in self.headers.items() if k.lower() in FORWARDED}
        if "X-Amzn-SageMaker-Accept" in self.headers:
            headers["Accept"] = self.headers["X-Amzn-SageMaker-Accept"]
        upstream = http.client.HTTPConnection(self.server.container.hostname, self.server.container.port, timeout=600)
        upstream.request("POST", "/invocations", body=body, headers=headers)
        answer = upstream.getresponse()
        if answer.status >= 400:
            return self._error(424, "ModelError", answer.read().decode(errors="replace")[:500], answer.status)
        if action == "invocations":
            return self._reply(200, answer.read(), answer.getheader("Content-Type", "application/json"))
        self.send_response(200)
        self.send_header("Content-Type", "application/vnd.amazon.eventstream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for message in self._events(answer):
            self.wfile.write(b"%x\r\n%b\r\n" % (len(message), message))
            self.wfile.flush()
        self.wfile.write(b"0\r\n\r\n")
        return None

    def _events(self, answer: http.client.HTTPResponse) -> Iterator[bytes]:
        try:
            while chunk := answer.read1(65536):
                for part in self.server.split(chunk):
                    yield payload_part(part)
        except (http.client.IncompleteRead, OSError) as e:
            yield stream_error(f"the model container's stream broke: {type(e).__name__}")

    def _signature_ok(self, body: bytes) -> bool:
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("AWS4-HMAC-SHA256 "):
            return False
        fields = dict(p.strip().split("=", 1) for p in auth.removeprefix("AWS4-HMAC-SHA256 ").split(","))
        key, date, region, service, _ = fields["Credential"].split("/")
        if (key, region, service) != (ACCESS_KEY, self.server.region, "sagemaker"):
            return False
        names = fields["SignedHeaders"].split(";")
        request = AWSRequest(
            method="POST", url=f"http://{self.headers['Host']}{self.path}", data=body,
            headers={n: self.headers[n] for n in names},
        )  # fmt: skip
        request.context["timestamp"] = self.headers["X-Amz-Date"]
        signer = SigV4Auth(Credentials(ACCESS_KEY, SECRET_KEY), "sagemaker", region)
        canonical = signer.canonical_request(request)
        return signer.signature(signer.string_to_sign(request, canonical), request) == fields["Signature"]

    def _reply(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _error(self, status: int, code: str, message: str, original: int | None = None) -> None:
        doc = {"__type": code, "message": message, **({"OriginalStatusCode": original} if original else {})}
        self._reply(status, json.dumps(doc).encode(), "application/x-amz-json-1.1")
