"""A llama-server-shaped SSE upstream for measuring the hop alone: `python tests/benchmarks/sse_upstream.py PORT`.

POST /v1/chat/completions answers the way llama-server's cpp-httplib does: HTTP/1.1, `Transfer-Encoding: chunked`,
one chunk per event (`data: {chat.completion.chunk}` with one token of content, about 230 bytes), a last event with
`timings`, `data: [DONE]`, then `0\\r\\n` and `\\r\\n` in two writes. The request body's JSON sets `max_tokens` and
`gap_ms` (the time between tokens; 0: as fast as the socket takes them). Costs next to nothing, so that on a
2-core machine what is measured is the hop's own CPU; never a stand-in for llama-server in a test.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time

HEAD = (
    b"HTTP/1.1 200 OK\r\nAccess-Control-Allow-Origin: \r\nContent-Type: text/event-stream\r\n"
    b"Keep-Alive: timeout=5, max=100\r\nServer: llama.cpp\r\nTransfer-Encoding: chunked\r\n\r\n"
)
WORDS = [" the", " cache", " holds", " recently", " used", " lines", ",", " and", " a", " miss", " goes", " to", " RAM"]


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def event(i: int) -> bytes:
    delta = {"content": WORDS[i % len(WORDS)]}
    doc = {"choices": [{"finish_reason": None, "index": 0, "delta": delta}], "created": 1767225600,
           "id": "chatcmpl-Qy2ECjLcOv0ry5nrZLG3vmrJUmoVHKoN", "model": "m", "system_fingerprint": "b11312-0000000",
           "object": "chat.completion.chunk"}  # fmt: skip
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


def final(n: int, seconds: float) -> bytes:
    timings = {"prompt_n": 16, "prompt_ms": 10.0, "predicted_n": n, "predicted_ms": seconds * 1000,
               "predicted_per_second": n / seconds if seconds else 0.0}  # fmt: skip
    doc = {"choices": [{"finish_reason": "length", "index": 0, "delta": {}}], "created": 1767225600,
           "id": "chatcmpl-Qy2ECjLcOv0ry5nrZLG3vmrJUmoVHKoN", "model": "m", "object": "chat.completion.chunk",
           "usage": {"completion_tokens": n, "prompt_tokens": 16, "total_tokens": n + 16},
           "timings": timings}  # fmt: skip
    return b"data: " + json.dumps(doc, separators=(",", ":")).encode() + b"\n\n"


async def _serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            body = json.loads(await reader.readexactly(length)) if length else {}
            if not head.startswith(b"POST"):
                writer.write(b'HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 15\r\n\r\n'
                             b'{"status":"ok"}')  # fmt: skip
                continue
            n, gap = int(body.get("max_tokens", 64)), float(body.get("gap_ms", 0)) / 1000
            writer.write(HEAD)
            start = time.monotonic()
            for i in range(n):
                if gap:
                    await asyncio.sleep(gap)
                writer.write(_chunk(event(i)))
                await writer.drain()
            writer.write(_chunk(final(n, time.monotonic() - start)))
            writer.write(_chunk(b"data: [DONE]\n\n"))
            writer.write(b"0\r\n")
            writer.write(b"\r\n")
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def main(port: int) -> None:
    server = await asyncio.start_server(_serve, "127.0.0.1", port, backlog=1024)
    print(f"listening on {server.sockets[0].getsockname()[1]}", flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 0))
