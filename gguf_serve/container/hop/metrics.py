"""Per-request timing: what one request through the hop saw, and the histograms it feeds."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gguf_serve.container.hop import names
from gguf_serve.container.hop.histogram import Histogram, format_value

HELP = {
    names.TTFT: "Seconds from the request reaching the hop to its first generated token (streamed: first content "
    "chunk sent; not streamed: derived from llama-server's timings)",
    names.ITL: "Seconds between consecutive generated tokens (streamed: chunk gaps; not streamed: mean per token)",
    names.QUEUE_WAIT: "Seconds a request spent outside prompt processing and decoding (waiting for a slot, "
    "tokenizing, HTTP): request duration minus llama-server's prompt_ms and predicted_ms",
    names.DECODE_TPS: "Generated tokens per second of decoding, per request (llama-server's predicted_per_second)",
    names.DRAFT_ACCEPTANCE: "Accepted draft tokens / drafted tokens, per request with speculative decoding",
    names.DURATION: "Seconds from the request reaching the hop to its last byte sent",
}


@dataclass
class RequestRecord:
    """One generation request as the hop saw it. Times are time.monotonic() seconds."""

    started: float
    stream: bool = False
    status: int | str | None = None  # the HTTP status, or "upstream_closed" for an answer llama-server cut off
    first_token: float | None = None
    last_token: float | None = None
    gaps: list[float] = field(default_factory=list)
    timings: dict[str, Any] | None = None
    finished: float | None = None
    client_closed: bool = False
    # The stream's last event ([DONE]) reached the client: a client that leaves now had the whole answer (the OpenAI
    # SDK closes its connection at [DONE], before the chunked body's end arrives).
    answered: bool = False
    observed: bool = False  # in the histograms and the request counter: each record is counted once, by observe

    def token(self, at: float) -> None:
        if self.first_token is None:
            self.first_token = at
        elif self.last_token is not None:
            self.gaps.append(at - self.last_token)
        self.last_token = at


MAX_SSE_LINE = 1024 * 1024  # a longer SSE line is not scanned (its pieces are not kept either)


class SseTokenScanner:
    """Reads an SSE byte stream as it passes (any chunking) and marks the time of each chunk carrying tokens.

    Pieces of an unfinished line are kept in a list and joined once, when its newline arrives: linear in the
    stream's size whatever the chunking (re-joining the buffer on every piece was quadratic)."""

    def __init__(self, record: RequestRecord) -> None:
        self.record = record
        self._pending: list[bytes] = []
        self._pending_len = 0
        self._overflow = False
        self.between = True  # between two lines: a read holding whole events may go to `event` directly
        self.done = False  # the final event, `data: [DONE]`, went past

    def feed(self, data: bytes, at: float) -> None:
        last = len(data) - 2
        if data.find(b"\n") == last and data[-1] == 10 and self.between:
            if data.startswith(b"data:"):  # one whole event (a line and the empty line), as llama-server sends it
                self.event(data[5:last].strip(), at)
            return
        start = 0
        while (end := data.find(b"\n", start)) != -1:
            line: bytes | None = data[start:end]
            if self._pending or self._overflow:
                line = None if self._overflow else b"".join([*self._pending, data[start:end]])
                self._pending, self._pending_len, self._overflow = [], 0, False
            if line is not None and line.startswith(b"data:"):
                self.event(line[5:].strip(), at)
            start = end + 1
        rest = data[start:]
        if rest and not self._overflow:
            self._pending.append(rest)
            self._pending_len += len(rest)
            if self._pending_len > MAX_SSE_LINE:
                self._pending, self._pending_len, self._overflow = [], 0, True
        self.between = not self._pending and not self._overflow

    def event(self, payload: bytes, at: float) -> None:
        """One `data:` field's value (stripped), whole."""
        # Byte checks; only the final event (timings) is parsed: the hop shares the CPU with llama-server.
        if payload == b"[DONE]":
            self.done = True
            return
        if carries_text(payload):
            self.record.token(at)
        if payload.find(b'"timings"') != -1:  # not `in`: bytes.__contains__ tries an int first, raising each time
            try:
                event = json.loads(payload)
            except ValueError:
                return
            timings = event.get("timings") if isinstance(event, dict) else None
            if isinstance(timings, dict):
                self.record.timings = timings


_TEXT_KEYS = (b'"content":"', b'"reasoning_content":"', b'"text":"')


def carries_text(payload: bytes) -> bool:
    """True for an SSE event whose JSON carries generated text: chat delta content or reasoning, completion text,
    llama-server's native /completion content, or a tool call. A key inside a JSON string has escaped quotes
    (\\"content\\":) and never matches."""
    for key in _TEXT_KEYS:
        at = payload.find(key)
        while at != -1:
            if payload[at + len(key) : at + len(key) + 1] != b'"':
                return True
            at = payload.find(key, at + 1)
    return payload.find(b'"tool_calls":[{') != -1


def _number(timings: dict[str, Any], key: str) -> float | None:
    value = timings.get(key)
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


class RequestMetrics:
    """The hop's histograms and request counter; `observe` takes a finished RequestRecord."""

    def __init__(self) -> None:
        self.histograms = {name: Histogram(name, HELP[name], names.BUCKETS[name]) for name in names.HISTOGRAMS}
        self._requests: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        # Admission and connections, set by the proxy (ints: read whole from another thread)
        self.shed = 0  # slot-taking requests answered 429
        self.unauthorized = 0  # requests answered 401 at the hop: without the key, never admitted nor shed
        self.wrong_model = 0  # requests answered 404 model_not_found at the hop: never admitted nor shed
        self.output_tokens = 0  # generated tokens of the answers relayed whole (the cost per token's denominator)
        self.routed = 0  # requests forwarded to the fleet that serves the model they name (models.py)
        self.route_shed = 0  # of those, answered 429: Limits.max_routed in flight already
        self.evicted = 0  # connections closed for a newer one with the table full
        self.in_flight = 0  # slot-taking requests admitted and not finished
        self.admission_limit: int | None = None  # in_flight beyond which requests are shed; None: never
        self.connections = 0  # client connections open
        self.draining = False  # a drain began (gguf_serve/container/hop/drain.py): /health 503, new requests 503
        self.drain_refused = 0
        self.drain_cut: int | None = None  # set when the drain ends

    def observe(self, r: RequestRecord) -> None:
        """Count a finished request, once: whichever way its exchange ended, a second call does nothing."""
        if r.observed:
            return
        r.observed = True
        finished = r.finished if r.finished is not None else time.monotonic()
        code = "client_closed" if r.client_closed else str(r.status or 0)
        with self._lock:
            self._requests[(code, "true" if r.stream else "false")] += 1
        h = self.histograms
        if r.client_closed or r.status != 200:
            return
        duration = finished - r.started
        h[names.DURATION].observe(duration)
        t = r.timings or {}
        prompt_ms, predicted_ms = _number(t, "prompt_ms"), _number(t, "predicted_ms")
        predicted = _number(t, "predicted_n")
        if predicted is not None and predicted > 0:
            with self._lock:
                self.output_tokens += int(predicted)
        predicted_n = _number(t, "predicted_n")
        if prompt_ms is not None and predicted_ms is not None:
            h[names.QUEUE_WAIT].observe(max(0.0, duration - (prompt_ms + predicted_ms) / 1000))
        if r.stream and r.first_token is not None:
            h[names.TTFT].observe(r.first_token - r.started)
            h[names.ITL].observe_each(r.gaps)
        elif not r.stream and predicted_ms is not None and predicted_n:
            per_token = predicted_ms / 1000 / predicted_n
            h[names.TTFT].observe(max(0.0, duration - predicted_ms / 1000) + per_token)
            if predicted_n > 1:
                h[names.ITL].observe(per_token, int(predicted_n) - 1)
        tps = _number(t, "predicted_per_second")
        if tps is not None and predicted_n and predicted_n > 1:
            h[names.DECODE_TPS].observe(tps)
        drafted, accepted = _number(t, "draft_n"), _number(t, "draft_n_accepted")
        if drafted and accepted is not None:
            h[names.DRAFT_ACCEPTANCE].observe(min(accepted, drafted) / drafted)

    def exposition(self) -> str:
        parts = [h.exposition() for h in self.histograms.values()]
        with self._lock:
            requests = sorted(self._requests.items())
        lines = [f"# HELP {names.REQUESTS} Generation requests through the hop", f"# TYPE {names.REQUESTS} counter"]
        lines += [f'{names.REQUESTS}{{code="{c}",stream="{s}"}} {format_value(n)}' for (c, s), n in requests]
        lines += [
            f"# HELP {names.SHED} Slot-taking requests the hop answered 429 (admission limit reached)",
            f"# TYPE {names.SHED} counter",
            f"{names.SHED} {self.shed}",
            f"# HELP {names.UNAUTHORIZED} Requests without the API key, answered 401 by the hop (not forwarded)",
            f"# TYPE {names.UNAUTHORIZED} counter",
            f"{names.UNAUTHORIZED} {self.unauthorized}",
            f"# HELP {names.OUTPUT_TOKENS} Generated tokens of the answers relayed (llama-server's predicted_n)",
            f"# TYPE {names.OUTPUT_TOKENS} counter",
            f"{names.OUTPUT_TOKENS} {self.output_tokens}",
            f"# HELP {names.ROUTED} Requests forwarded to the fleet that serves the model they name (counted there)",
            f"# TYPE {names.ROUTED} counter",
            f"{names.ROUTED} {self.routed}",
            f"# HELP {names.ROUTE_SHED} Requests for another fleet's model answered 429: too many forwards at once",
            f"# TYPE {names.ROUTE_SHED} counter",
            f"{names.ROUTE_SHED} {self.route_shed}",
            f"# HELP {names.WRONG_MODEL} Requests naming a model this endpoint does not serve, answered 404 by the hop",
            f"# TYPE {names.WRONG_MODEL} counter",
            f"{names.WRONG_MODEL} {self.wrong_model}",
            f"# HELP {names.IN_FLIGHT} Slot-taking requests admitted to llama-server and not finished",
            f"# TYPE {names.IN_FLIGHT} gauge",
            f"{names.IN_FLIGHT} {self.in_flight}",
            f"# HELP {names.CONNECTIONS} Client connections open at the hop",
            f"# TYPE {names.CONNECTIONS} gauge",
            f"{names.CONNECTIONS} {self.connections}",
            f"# HELP {names.CONNECTIONS_EVICTED} Connections closed to make room for a newer one (the cap)",
            f"# TYPE {names.CONNECTIONS_EVICTED} counter",
            f"{names.CONNECTIONS_EVICTED} {self.evicted}",
        ]
        lines += [
            f"# HELP {names.DRAINING} 1 once this instance drains (a Spot notice, or it is leaving the group)",
            f"# TYPE {names.DRAINING} gauge",
            f"{names.DRAINING} {int(self.draining)}",
            f"# HELP {names.DRAIN_REFUSED} Slot-taking requests the hop answered 503 because it drains",
            f"# TYPE {names.DRAIN_REFUSED} counter",
            f"{names.DRAIN_REFUSED} {self.drain_refused}",
        ]
        if self.drain_cut is not None:
            lines += [
                f"# HELP {names.DRAIN_STREAMS_CUT} Streams still running when the drain ended (its deadline)",
                f"# TYPE {names.DRAIN_STREAMS_CUT} gauge",
                f"{names.DRAIN_STREAMS_CUT} {self.drain_cut}",
            ]
        if self.admission_limit is not None:
            lines += [
                f"# HELP {names.ADMISSION_LIMIT} Requests in flight beyond which the hop sheds with 429",
                f"# TYPE {names.ADMISSION_LIMIT} gauge",
                f"{names.ADMISSION_LIMIT} {self.admission_limit}",
            ]
        return "".join(parts) + "\n".join(lines) + "\n"
