"""The benchmark itself: the report's single-stream method, and a streaming concurrency mode.

Definitions (also in docs/benchmark.md):
- total time: wall clock around one request, as the client sees it (HTTP and JSON included).
- effective tok/s: completion tokens / total time (prompt processing included, as in the report).
- server time: timings.prompt_ms + timings.predicted_ms; harness overhead = total time - server time.
- generation-phase tokens: predicted_per_second * predicted_ms / 1000, the server's own count (llama-server's
  rate excludes the first token, which prompt processing produces: predicted_n - 1 in the pinned build).
- harness generation rate: generation-phase tokens / (total time - prompt_ms), to set against predicted_per_second.
- TTFT: request sent to the first streamed text (answer or reasoning); ITL: (last text - first text) /
  (completion tokens - 1).
- a valid measurement: a chat completion with at least one completion token and a finish_reason of "stop" or
  "length" (streams: also the usage chunk llama-server sends last). Anything else is a row with an "error" that
  no summary counts: a 200 with 0 tokens, an HTML page, a stream cut before its end, a 500, a timeout.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from gguf_serve.local.bench.method import request_body

Log = Callable[[str], None]
OnRow = Callable[[dict[str, Any]], None]
FINISHED = ("stop", "length")


class InvalidResponse(Exception):
    """The server answered, but not with a measurement (the message says why)."""


def invalid_reason(row: dict[str, Any], *, streamed: bool) -> str | None:
    if streamed and not row.get("usage_seen"):
        return "the stream ended before its usage chunk (cut short)"
    if row.get("finish_reason") not in FINISHED:
        return f"finish_reason {row.get('finish_reason')!r}: the answer did not finish"
    if row.get("completion_tokens", 0) <= 0:
        return "0 completion tokens"
    return None


def _refused(exc: Exception) -> bool:
    from openai import AuthenticationError, PermissionDeniedError

    return isinstance(exc, AuthenticationError | PermissionDeniedError)


def measured(row: dict[str, Any]) -> bool:
    """A measured (not warm-up) request that produced a valid measurement."""
    return not row["warmup"] and "error" not in row


def attempt(request: Callable[[], dict[str, Any]], *, streamed: bool) -> dict[str, Any]:
    """One request as a row: its measurement, or an "error" that says what went wrong (never an exception)."""
    try:
        row = request()
    except Exception as exc:  # noqa: BLE001 - a failed request is a recorded result, not a crash
        if _refused(exc):
            raise  # a wrong key fails every request alike: stop at the first
        failed: dict[str, Any] = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        status = getattr(exc, "status_code", None)  # openai's APIStatusError: 429 is the hop shedding load
        return {**failed, "status": status} if isinstance(status, int) else failed
    reason = invalid_reason(row, streamed=streamed)
    return {**row, "error": f"invalid response: {reason}"} if reason else row


def stderr_log(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _extra(obj: Any) -> dict[str, Any]:
    """Fields llama-server adds beyond the OpenAI schema (`timings`, `reasoning_content`)."""
    return getattr(obj, "model_extra", None) or {}


def _acceptance(draft_n: float, accepted: float) -> float | None:
    return accepted / draft_n if draft_n else None


def generation_tokens(timings: dict[str, Any]) -> float:
    """Tokens llama-server's predicted_per_second counts over predicted_ms (the first token is not one of them)."""
    return float(timings.get("predicted_per_second", 0.0)) * float(timings.get("predicted_ms", 0.0)) / 1000


def harness_generation_rate(wall_s: float, timings: dict[str, Any]) -> float | None:
    """The server's generation rate as the harness's clock sees it: overhead lands in the denominator."""
    generating_s = wall_s - float(timings.get("prompt_ms", 0.0)) / 1000
    return generation_tokens(timings) / generating_s if timings and generating_s > 0 else None


def _timing_fields(wall: float, completion: int, timings: dict[str, Any]) -> dict[str, Any]:
    prompt_ms = float(timings.get("prompt_ms", 0.0))
    predicted_ms = float(timings.get("predicted_ms", 0.0))
    server_s = (prompt_ms + predicted_ms) / 1000
    return {
        "wall_s": wall,
        "completion_tokens": completion,
        "effective_tok_s": completion / wall if wall > 0 else 0.0,
        "server_s": server_s if timings else None,
        "overhead_ms": (wall - server_s) * 1000 if timings else None,
        "draft_acceptance": _acceptance(timings.get("draft_n", 0), timings.get("draft_n_accepted", 0)),
        "timings": timings,
    }


def single_request(client: Any, model: str, max_tokens: int) -> dict[str, Any]:
    from openai.types.chat import ChatCompletion

    deadline = request_deadline(client)
    start = time.perf_counter()
    # The body is read here, not by the client, so that --timeout bounds the whole answer, not each read.
    with client.chat.completions.with_streaming_response.create(
        **request_body(model=model, max_tokens=max_tokens)
    ) as raw:
        body = bytearray()
        for block in raw.iter_bytes():
            body += block
            if deadline is not None and time.perf_counter() - start > deadline:
                raise TimeoutError(f"{_host(client)} was still sending after the {deadline:g} s request deadline")
    wall = time.perf_counter() - start
    try:
        doc = json.loads(body)
    except ValueError:
        doc = None
    if not isinstance(doc, dict) or not isinstance(doc.get("choices"), list):
        raise InvalidResponse(f"not a chat completion: {bytes(body[:120])!r}")
    resp = ChatCompletion.construct(**doc)  # lenient, like the client: validity is judged by invalid_reason
    timings = _extra(resp).get("timings") or {}
    completion = resp.usage.completion_tokens if resp.usage else int(timings.get("predicted_n", 0))
    return {
        "prompt_tokens": resp.usage.prompt_tokens if resp.usage else timings.get("prompt_n"),
        "finish_reason": resp.choices[0].finish_reason if resp.choices else None,
        **_timing_fields(wall, completion, timings),
    }


def streaming_request(client: Any, model: str, max_tokens: int) -> dict[str, Any]:
    start = time.perf_counter()
    first = last = None
    timings: dict[str, Any] = {}
    usage = finish = None
    deadline = request_deadline(client)
    stream = client.chat.completions.create(**request_body(model=model, max_tokens=max_tokens, stream=True))
    for chunk in stream:
        now = time.perf_counter()
        if deadline is not None and now - start > deadline:
            stream.close()
            raise TimeoutError(f"{_host(client)} was still streaming after the {deadline:g} s request deadline")
        timings = _extra(chunk).get("timings") or timings
        usage = chunk.usage or usage
        for choice in chunk.choices:
            delta = choice.delta
            if delta is not None and (delta.content or _extra(delta).get("reasoning_content")):
                first = now if first is None else first
                last = now
            finish = choice.finish_reason or finish
    wall = time.perf_counter() - start
    completion = usage.completion_tokens if usage else int(timings.get("predicted_n", 0))
    return {
        "prompt_tokens": usage.prompt_tokens if usage else timings.get("prompt_n"),
        "finish_reason": finish,
        "usage_seen": usage is not None,
        "ttft_s": (first - start) if first is not None else None,
        "itl_s": (last - first) / (completion - 1) if first is not None and last and completion > 1 else None,
        **_timing_fields(wall, completion, timings),
    }


def request_deadline(client: Any) -> float | None:
    """The client's timeout as a deadline for a whole stream (the HTTP client applies it to each read only)."""
    timeout = getattr(client, "timeout", None)
    if isinstance(timeout, int | float):
        return float(timeout)
    read = getattr(timeout, "read", None)
    return float(read) if isinstance(read, int | float) else None


def _host(client: Any) -> str:
    netloc = getattr(getattr(client, "base_url", None), "netloc", b"")
    return netloc.decode() if isinstance(netloc, bytes) else str(netloc)


def _describe(row: dict[str, Any]) -> str:
    if "error" in row:
        return f"FAILED {row['error']}"
    t = row["timings"]
    parts = [f"{row['completion_tokens']} tok in {row['wall_s']:.2f} s = {row['effective_tok_s']:.2f} tok/s"]
    if t:
        parts.append(
            f"server gen {t.get('predicted_per_second', 0):.2f} tok/s, prompt {t.get('prompt_per_second', 0):.1f} tok/s"
        )
    if row["draft_acceptance"] is not None:
        parts.append(f"draft acc {row['draft_acceptance']:.1%}")
    if row.get("ttft_s") is not None:
        parts.append(f"TTFT {row['ttft_s'] * 1000:.0f} ms")
    return ", ".join(parts)


def run_sequential(
    client: Any,
    model: str,
    *,
    repetitions: int,
    warmup: int,
    max_tokens: int,
    log: Log = stderr_log,
    on_row: OnRow | None = None,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    """The report's method: one request at a time, warm-up requests first and marked as such.

    A failed or invalid request is a row with "error" and the run goes on; `on_row` sees each row as it ends
    (the CLI writes it to the results file then, so nothing finished is lost).
    """
    rows = []
    for i in range(warmup + repetitions):
        is_warmup = i < warmup
        tag = f"warmup {i + 1}/{warmup}" if is_warmup else f"run {i - warmup + 1}/{repetitions}"
        result = attempt(lambda: single_request(client, model, max_tokens), streamed=False)
        row = {"index": first_index + i, "warmup": is_warmup, **result}
        log(f"[{tag}] {_describe(row)}")
        rows.append(row)
        if on_row is not None:
            on_row(row)
    return rows


def summarize_sequential(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Pooled over the valid measured (non-warm-up) runs: rates are total tokens over total time."""
    runs = [r for r in rows if measured(r)]
    if not runs:
        raise ValueError("no valid measured request")
    n = len(runs)
    wall = sum(r["wall_s"] for r in runs)
    tokens = sum(r["completion_tokens"] for r in runs)
    t = [r["timings"] for r in runs]
    out: dict[str, Any] = {
        "runs": n,
        "total_time_s": wall / n,
        "completion_tokens": tokens / n,
        "effective_tok_s": tokens / wall,
        "effective_tok_s_min": min(r["effective_tok_s"] for r in runs),
        "effective_tok_s_max": max(r["effective_tok_s"] for r in runs),
        "draft_acceptance": None,
    }
    if all(t):
        prompt_n = sum(x.get("prompt_n", 0) for x in t)
        prompt_ms = sum(x.get("prompt_ms", 0.0) for x in t)
        predicted_n = sum(x.get("predicted_n", 0) for x in t)
        predicted_ms = sum(x.get("predicted_ms", 0.0) for x in t)
        generated = sum(generation_tokens(x) for x in t)
        draft_n = sum(x.get("draft_n", 0) for x in t)
        accepted = sum(x.get("draft_n_accepted", 0) for x in t)
        server_s = (prompt_ms + predicted_ms) / 1000
        out.update(
            {
                "prompt_per_second": prompt_n / prompt_ms * 1000 if prompt_ms else None,
                "predicted_per_second": generated / predicted_ms * 1000 if predicted_ms else None,
                "draft_n": draft_n,
                "draft_n_accepted": accepted,
                "draft_acceptance": _acceptance(draft_n, accepted),
                "speculative": any("draft_n" in x for x in t),
                "server_time_s": server_s / n,
                "harness_overhead_ms": (wall - server_s) * 1000 / n,
                "harness_overhead_pct": (wall / server_s - 1) * 100 if server_s else None,
                "harness_generation_tok_s": generated / (wall - prompt_ms / 1000) if wall > prompt_ms / 1000 else None,
                "server_effective_tok_s": predicted_n / server_s if server_s else None,
            }
        )
    return out


def run_concurrent(
    client: Any,
    model: str,
    *,
    concurrency: int,
    repetitions: int,
    warmup: int,
    max_tokens: int,
    log: Log = stderr_log,
    on_row: OnRow | None = None,
    tick: Callable[[float], None] | None = None,
) -> tuple[list[dict[str, Any]], float]:
    """`concurrency` streaming clients, each sending `repetitions` requests back to back; returns rows and wall time.

    The clients are daemon threads joined in short waits, so Ctrl-C reaches the caller at once (a pool would
    hold the process until every stream had ended); after it no row reaches `on_row`. `tick(seconds)` is called
    about once a second while the phase runs (progress).
    """
    rows: list[dict[str, Any]] = []
    lock = threading.Lock()
    stopped = threading.Event()

    def request() -> dict[str, Any]:
        return attempt(lambda: streaming_request(client, model, max_tokens), streamed=True)

    def done(row: dict[str, Any]) -> None:
        if on_row is not None:
            with lock:
                if not stopped.is_set():
                    on_row(row)

    for i in range(warmup):
        row = {"client": None, "warmup": True, **request()}
        log(f"[warmup {i + 1}/{warmup}] {_describe(row)}")
        rows.append(row)
        done(row)
    phase_start = time.perf_counter()
    finished: list[list[dict[str, Any]]] = [[] for _ in range(concurrency)]
    raised: list[BaseException] = []

    def client_loop(c: int) -> None:
        try:
            for r in range(repetitions):
                if stopped.is_set():
                    return
                sent = time.perf_counter() - phase_start
                row = {"client": c, "warmup": False, "sent_s": sent, **request()}
                if stopped.is_set():
                    return
                log(f"[client {c + 1}/{concurrency} req {r + 1}/{repetitions}] {_describe(row)}")
                finished[c].append(row)
                done(row)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread (a refused key)
            raised.append(exc)
            stopped.set()

    threads = [threading.Thread(target=client_loop, args=(c,), daemon=True) for c in range(concurrency)]
    for t in threads:
        t.start()
    try:
        last_tick = time.perf_counter()
        for t in threads:
            while t.is_alive():
                t.join(0.1)
                if tick is not None and time.perf_counter() - last_tick >= 1.0:
                    last_tick = time.perf_counter()
                    tick(last_tick - phase_start)
    except BaseException:
        stopped.set()  # Ctrl-C: the streams still open die with the process; nothing more is recorded
        raise
    if raised:
        raise raised[0]
    for client_rows in finished:
        rows += client_rows
    return rows, time.perf_counter() - phase_start


def percentile(values: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default), q in 0..100."""
    if not values:
        raise ValueError("percentile of no values")
    s = sorted(values)
    pos = (len(s) - 1) * q / 100
    lo = int(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _spread(values: list[float], scale: float = 1.0) -> dict[str, float] | None:
    if not values:
        return None
    return {
        "mean": sum(values) / len(values) * scale,
        **{f"p{q}": percentile(values, q) * scale for q in (50, 95, 99)},
    }


def summarize_concurrent(rows: list[dict[str, Any]], wall: float, concurrency: int) -> dict[str, Any]:
    ok = [r for r in rows if not r["warmup"] and "error" not in r]
    failed = [r for r in rows if not r["warmup"] and "error" in r]
    tokens = sum(r["completion_tokens"] for r in ok)
    draft_n = sum(r["timings"].get("draft_n", 0) for r in ok)
    accepted = sum(r["timings"].get("draft_n_accepted", 0) for r in ok)
    return {
        "concurrency": concurrency,
        "requests": len(ok),
        "errors": len(failed),
        "rate_limited": sum(1 for r in failed if r.get("status") == 429),
        "wall_s": wall,
        "completion_tokens": tokens,
        "aggregate_tok_s": tokens / wall if wall > 0 else 0.0,
        "per_request_tok_s": _spread([r["effective_tok_s"] for r in ok]),
        "ttft_ms": _spread([r["ttft_s"] for r in ok if r["ttft_s"] is not None], 1000),
        "itl_ms": _spread([r["itl_s"] for r in ok if r["itl_s"] is not None], 1000),
        "latency_s": _spread([r["wall_s"] for r in ok]),
        "draft_acceptance": _acceptance(draft_n, accepted),
    }
