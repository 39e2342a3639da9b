"""SageMaker's side of the contract, played against a container: its pings, its header stripping, its invocations.

Used by the real-server tests (tests/container/sagemaker/test_real_server.py) and the image tier's rehearsal
(tests/images/test_sagemaker_contract.py). Sources: gguf_serve/container/sagemaker/contract.py.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass, field

from gguf_serve.container.sagemaker.contract import PING_TIMEOUT_S

# The request headers InvokeEndpoint / InvokeEndpointWithResponseStream define (SageMaker Runtime API Reference);
# SageMaker strips every other one before the container sees the request: Authorization among them.
FORWARDED = {
    "content-type",
    "accept",
    "x-amzn-sagemaker-custom-attributes",
    "x-amzn-sagemaker-target-model",
    "x-amzn-sagemaker-target-variant",
    "x-amzn-sagemaker-target-container-hostname",
    "x-amzn-sagemaker-inference-id",
    "x-amzn-sagemaker-enable-explanations",
    "x-amzn-sagemaker-inference-component",
    "x-amzn-sagemaker-session-id",
}


def stripped(headers: dict[str, str]) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() in FORWARDED}


@dataclass
class Pings:
    """GET /ping every `interval` s from the container's start, each with SageMaker's 2 s timeout."""

    port: int
    interval: float = 5.0
    seen: list[tuple[float, int | None, float]] = field(default_factory=list)  # (since start, status, seconds)
    _stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> Pings:
        threading.Thread(target=self._run, daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        started = time.monotonic()
        while not self._stop.is_set():
            sent = time.monotonic()
            status = None
            try:
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=PING_TIMEOUT_S)
                conn.request("GET", "/ping")
                status = conn.getresponse().status
                conn.close()
            except (OSError, http.client.HTTPException):
                pass
            took = time.monotonic() - sent
            self.seen.append((sent - started, status, took))
            self._stop.wait(max(0.0, self.interval - took))

    def first_ok(self) -> float | None:
        return next((t for t, status, _ in self.seen if status == 200), None)


def invoke(port: int, body: dict, headers: dict[str, str] | None = None, timeout: float = 300):
    """POST /invocations as SageMaker forwards it: (status, headers, [(seconds since sent, bytes)], complete)."""
    sent = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    conn.request(
        "POST", "/invocations", json.dumps(body), stripped({"Content-Type": "application/json", **(headers or {})})
    )
    response = conn.getresponse()
    pieces, complete = [], True
    try:
        while chunk := response.read1(65536):
            pieces.append((time.monotonic() - sent, chunk))
    except (http.client.IncompleteRead, OSError):
        complete = False  # the stream was cut: no final chunk
    return response.status, dict(response.getheaders()), pieces, complete


def sse_text(pieces: list[tuple[float, bytes]]) -> str:
    """The generated text of a chat-completions SSE stream."""
    text = []
    for line in b"".join(p for _, p in pieces).decode().splitlines():
        if line.startswith("data: ") and line != "data: [DONE]":
            for choice in json.loads(line[6:]).get("choices", []):
                text.append((choice.get("delta") or {}).get("content") or "")
    return "".join(text)
