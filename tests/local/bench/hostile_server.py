"""An OpenAI-compatible server on loopback that misbehaves on purpose, one scripted answer per request."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODEL = "hostile-model"


def completion(tokens: int = 5, finish: str | None = "stop") -> dict[str, Any]:
    return {
        "id": "c1", "object": "chat.completion", "created": 0, "model": MODEL,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi " * tokens}, "finish_reason": finish}],
        "usage": {"prompt_tokens": 10, "completion_tokens": tokens, "total_tokens": 10 + tokens},
        "timings": {"prompt_n": 10, "prompt_ms": 5.0, "predicted_n": tokens, "predicted_ms": 20.0 * tokens,
                    "predicted_per_second": 50.0, "prompt_per_second": 2000.0},
    }  # fmt: skip


def _chunk(delta: dict[str, Any], finish: str | None = None, usage: dict[str, Any] | None = None) -> bytes:
    doc = {"id": "c1", "object": "chat.completion.chunk", "created": 0, "model": MODEL,
           "choices": [{"index": 0, "delta": delta, "finish_reason": finish}] if usage is None else [],
           "usage": usage}  # fmt: skip
    return f"data: {json.dumps(doc)}\n\n".encode()


class HostileServer:
    """`script` lists what each chat request gets, in order (the last one repeats):
    ok | zero-tokens | html | cut-stream | 500 | 429 (the hop shedding load) | no-finish |
    slow-stream (a token every 0.5 s for 10 s) | slow-body (the JSON answer a byte every 0.05 s, about 30 s).
    `models` is the raw /v1/models body."""

    def __init__(self, script: list[str], models: bytes | None = None) -> None:
        self.script = list(script)
        self.models = (
            models
            if models is not None
            else json.dumps(
                {"object": "list", "data": [{"id": MODEL, "object": "model", "created": 0, "owned_by": "me"}]}
            ).encode()
        )
        self.served: list[str] = []
        self.asked: list[str] = []  # each chat request's model
        self.lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._send(200, server.models, "application/json")

            def do_POST(self) -> None:  # noqa: N802
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a client giving up on purpose
                    self._answer()

            def _answer(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with server.lock:
                    what = server.script[min(len(server.served), len(server.script) - 1)]
                    server.served.append(what)
                    server.asked.append(body.get("model"))
                stream = bool(body.get("stream"))
                if what == "500":
                    return self._send(500, b'{"error": {"message": "boom", "code": 500}}', "application/json")
                if what == "429":
                    body = b'{"error": {"message": "over admission", "type": "rate_limit_error", "code": 429}}'
                    return self._send(429, body, "application/json")
                if what == "html":
                    return self._send(200, b"<html><body>502 Bad Gateway</body></html>", "text/html")
                if not stream:
                    doc = completion(0 if what == "zero-tokens" else 5, None if what == "no-finish" else "stop")
                    return self._send(200, json.dumps(doc).encode(), "application/json", slow=what == "slow-body")
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Connection", "close")
                self.end_headers()
                self.wfile.write(_chunk({"role": "assistant", "content": ""}))
                n = {"zero-tokens": 0, "slow-stream": 20}.get(what, 5)
                for _ in range(n):
                    self.wfile.write(_chunk({"content": "hi "}))
                    if what == "slow-stream":
                        self.wfile.flush()
                        time.sleep(0.5)
                if what == "cut-stream":
                    self.wfile.flush()
                    return  # connection closes: no finish_reason, no usage, no [DONE]
                self.wfile.write(_chunk({}, "stop"))
                self.wfile.write(_chunk({}, usage=completion(n)["usage"]))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                self.close_connection = True

            def _send(self, status: int, data: bytes, ctype: str, slow: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if not slow:
                    return self.wfile.write(data)
                self.wfile.flush()
                for i in range(len(data)):
                    self.wfile.write(data[i : i + 1])
                    self.wfile.flush()
                    time.sleep(0.05)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)

    def __enter__(self) -> HostileServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
