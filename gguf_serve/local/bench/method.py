"""The field report's benchmark method (section 4.3), in one place."""

from __future__ import annotations

from typing import Any

PROMPT = "从优点、缺点两个方面介绍新能源汽车，分两点罗列，语言通俗，字数120字左右，不用专业名词"
MAX_TOKENS = 2048
REPETITIONS = 3
WARMUP = 1
REQUEST_TIMEOUT_S = 1800.0  # 2048 tokens at the report's slowest 4.56 tok/s take about 450 s


def request_body(*, model: str, max_tokens: int, stream: bool = False) -> dict[str, Any]:
    """Keyword arguments for `chat.completions.create`: thinking on, prompt cache off for this request."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        # llama-server request fields; the openai client passes them through untouched.
        "extra_body": {"cache_prompt": False, "chat_template_kwargs": {"enable_thinking": True}},
    }
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def describe(*, max_tokens: int, repetitions: int, warmup: int, concurrency: int | None) -> dict[str, Any]:
    """The method as recorded in every results file; concurrency None means the report's one request at a time."""
    return {
        "prompt": PROMPT,
        "max_tokens": max_tokens,
        "thinking": True,
        "cache_prompt": False,
        "repetitions": repetitions,
        "warmup": warmup,
        "concurrency": concurrency,
        "stream": concurrency is not None,
    }
