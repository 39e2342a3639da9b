"""The report's method against a SageMaker endpoint: `gguf-serve-bench run --sagemaker-endpoint NAME`.

The benchmark speaks the OpenAI API through the openai client; here that client's HTTP transport is SageMaker
Runtime, SigV4-signed by botocore with the caller's credentials (IAM is the gate: no API key):
- POST /chat/completions is InvokeEndpointWithResponseStream. SageMaker hands the container's bytes back in
  PayloadPart events split anywhere, even inside a UTF-8 character; a streamed request gets them as they come (the
  SDK's SSE decoder takes any split), a non-streamed one (the report's method) is sent streamed and its SSE lines are
  reassembled and folded into one chat completion: text, finish_reason, usage and llama-server's timings. A 2048-token
  answer on a CPU takes longer than InvokeEndpoint's 60 s (gguf_serve/container/sagemaker/contract.py SYNC_ANSWER_S).
- GET /models is an InvokeEndpoint routed to llama-server's /v1/models by the custom attributes.
A SageMaker error (throttling, a container error, an endpoint that does not exist) becomes the HTTP answer the
client records as a failed request, never a traceback.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any

import httpx2 as httpx  # the HTTP client the pinned openai SDK uses (its fork of httpx)

from gguf_serve.container.sagemaker.routes import ROUTE_KEY

BASE_URL = "https://sagemaker-runtime.invalid/v1"  # the client needs a URL; the transport never opens it
JSON = "application/json"


def sagemaker_label(label: Any, catalog: Any) -> Any:
    """A run's label on SageMaker: the profile's ml type (profiles/sagemaker.toml) instead of its EC2 type."""
    from dataclasses import replace

    from gguf_serve.local.bench.results import hardware_label

    hosting = catalog.hosting.get(label.instance_type)
    if hosting is None:
        raise ValueError(
            f"profile {label.profile!r} runs on {label.instance_type}, which profiles/sagemaker.toml does not host; "
            "pass --profile of a SageMaker stack's profile (graviton-moe, intel-moe, gpu-mtp, ...)"
        )
    ec2 = catalog.hardware[hosting.ec2_type]
    return replace(label, instance_type=hosting.ml_type, hardware=hardware_label(hosting.hardware(ec2)))


def make_sagemaker_client(endpoint_name: str, *, region: str | None, timeout: float, runtime: Any = None) -> Any:
    """An OpenAI client whose requests go to `endpoint_name` through SageMaker Runtime (`runtime`: a boto3 client)."""
    from openai import OpenAI

    if runtime is None:
        import boto3
        from botocore.config import Config

        # One attempt: a retried request would count its failed attempt's time as generation time.
        config = Config(read_timeout=timeout, connect_timeout=10, retries={"total_max_attempts": 1})
        runtime = boto3.session.Session().client("sagemaker-runtime", region_name=region, config=config)
    transport = SageMakerTransport(endpoint_name, runtime)
    http = httpx.Client(transport=transport, timeout=timeout)
    return OpenAI(base_url=BASE_URL, api_key="iam", http_client=http, timeout=timeout, max_retries=0)


class SageMakerTransport(httpx.BaseTransport):
    def __init__(self, endpoint_name: str, runtime: Any) -> None:
        self.endpoint_name = endpoint_name
        self.runtime = runtime

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        from botocore.exceptions import BotoCoreError, ClientError

        path = request.url.path.rstrip("/")
        try:
            if request.method == "GET" and path.endswith("/models"):
                answer = self.runtime.invoke_endpoint(
                    EndpointName=self.endpoint_name, Body=b"{}", ContentType=JSON, Accept=JSON,
                    CustomAttributes=f"{ROUTE_KEY}=/v1/models",
                )  # fmt: skip
                return httpx.Response(200, headers={"content-type": JSON}, content=answer["Body"].read())
            if request.method == "POST" and path.endswith("/chat/completions"):
                return self._chat(json.loads(request.read()))
        except ClientError as e:
            return _error_response(e)
        except BotoCoreError as e:
            return httpx.Response(502, json=_error(f"SageMaker Runtime: {e}"))
        return httpx.Response(404, json=_error(f"{request.method} {path}: a SageMaker endpoint serves chat here"))

    def _chat(self, body: dict[str, Any]) -> httpx.Response:
        streamed = bool(body.get("stream"))
        sent = body if streamed else {**body, "stream": True, "stream_options": {"include_usage": True}}
        answer = self.runtime.invoke_endpoint_with_response_stream(
            EndpointName=self.endpoint_name, Body=json.dumps(sent).encode(), ContentType=JSON,
            Accept="text/event-stream",
        )  # fmt: skip
        parts = payload_parts(answer["Body"])
        if streamed:
            return httpx.Response(200, headers={"content-type": "text/event-stream"}, stream=_Stream(parts))
        return httpx.Response(200, headers={"content-type": JSON}, content=json.dumps(fold(sse_events(parts))))


class _Stream(httpx.SyncByteStream):
    def __init__(self, parts: Iterator[bytes]) -> None:
        self.parts = parts

    def __iter__(self) -> Iterator[bytes]:
        yield from self.parts


class StreamBroken(Exception):
    """SageMaker ended the response stream with an error event; the message is SageMaker's."""


def payload_parts(events: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """The bytes of each PayloadPart, in order; an error event ends the stream with its message."""
    from botocore.exceptions import EventStreamError

    try:
        for event in events:
            if "PayloadPart" in event:
                yield event["PayloadPart"].get("Bytes", b"")
            elif event:  # ModelStreamError, InternalStreamFailure
                kind, detail = next(iter(event.items()))
                raise StreamBroken(f"{kind}: {detail.get('Message', detail)}")
    except EventStreamError as e:
        raise StreamBroken(str(e)) from None


def sse_events(parts: Iterable[bytes]) -> Iterator[dict[str, Any]]:
    """The JSON events of an SSE byte stream split anywhere (a line, a JSON object, a UTF-8 character)."""
    pending = b""
    for part in parts:
        pending += part
        *lines, pending = pending.split(b"\n")
        for line in lines:
            yield from _event(line)
    yield from _event(pending)


def _event(line: bytes) -> Iterator[dict[str, Any]]:
    line = line.strip()
    if line.startswith(b"data:") and line[5:].strip() != b"[DONE]":
        doc = json.loads(line[5:])
        if isinstance(doc, dict):
            yield doc


def fold(events: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """One chat.completion from the chunks of a chat.completion.chunk stream, as llama-server would have answered."""
    content, reasoning = [], []
    out: dict[str, Any] = {"object": "chat.completion"}
    finish = None
    for event in events:
        if "error" in event:  # llama-server's error event mid-stream
            raise StreamBroken(f"llama-server: {event['error']}")
        for key in ("id", "created", "model", "system_fingerprint", "usage", "timings"):
            if event.get(key) is not None:
                out[key] = event[key]
        for choice in event.get("choices") or []:
            delta = choice.get("delta") or {}
            content.append(delta.get("content") or "")
            reasoning.append(delta.get("reasoning_content") or "")
            finish = choice.get("finish_reason") or finish
    message: dict[str, Any] = {"role": "assistant", "content": "".join(content)}
    if any(reasoning):
        message["reasoning_content"] = "".join(reasoning)
    out["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
    return out


def _error(message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "sagemaker_error"}}


def _error_response(e: Any) -> httpx.Response:
    """SageMaker's error as the HTTP answer: its own status (400 validation, 424 a model error, 429 throttling)."""
    meta = e.response.get("ResponseMetadata", {})
    status = int(meta.get("HTTPStatusCode") or 500)
    err = e.response.get("Error", {})
    original = e.response.get("OriginalStatusCode")
    detail = f" (the container answered {original})" if original else ""
    return httpx.Response(status, json=_error(f"{err.get('Code', 'Error')}: {err.get('Message', '')}{detail}"))
