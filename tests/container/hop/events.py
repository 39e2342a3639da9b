"""llama-server's SSE events as the hop's tests and their scripted upstream write them."""

from __future__ import annotations

import json


def sse(event: dict | str) -> bytes:
    return (
        b"data: " + (event if isinstance(event, str) else json.dumps(event, separators=(",", ":"))).encode() + b"\n\n"
    )


def chat_chunk(content: str | None = None, **extra) -> dict:
    delta = {} if content is None else {"content": content}
    return {
        "choices": [{"index": 0, "delta": delta, "finish_reason": None}],
        "object": "chat.completion.chunk",
        **extra,
    }


TIMINGS = {"prompt_n": 10, "prompt_ms": 100.0, "predicted_n": 4, "predicted_ms": 200.0, "predicted_per_second": 20.0}
