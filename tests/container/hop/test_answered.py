"""A client that has the whole answer may leave before the chunked body's end: the answer still counts as answered.

The OpenAI SDK closes its connection at `data: [DONE]` (openai 3.x: `break`, then `response.close()`), before
llama-server's final zero-length chunk. The hop saw the client leave and counted the request `client_closed`, with
no TTFT or inter-token observation: the observability e2e test saw 11 of its 12 TTFT observations whenever the
close won that race.
"""

from __future__ import annotations

import time

from gguf_serve.container.hop import names
from gguf_serve.container.hop.proxy import ProxyServer
from gguf_serve.container.metrics.prometheus import parse_prometheus

from .conftest import KEY, Upstream, hop_url


def _count(hop: ProxyServer, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels`."""
    families = parse_prometheus(hop.metrics.exposition()).values()
    samples = [s for f in families for s in f.samples if s.name == name and labels.items() <= s.labels.items()]
    return sum(s.value for s in samples)


def test_the_sdk_leaving_at_done_is_an_answered_request_with_its_latencies(upstream: Upstream, hop: ProxyServer):
    from openai import OpenAI

    upstream.gate.set()
    upstream.tail_pause_s = 1.0  # the SDK has closed long before the body's end arrives
    client = OpenAI(base_url=f"{hop_url(hop)}/v1", api_key=KEY, max_retries=0)
    text = "".join(
        event.choices[0].delta.content or ""
        for event in client.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], stream=True)
        if event.choices
    )
    assert text == "abcd"
    deadline = time.monotonic() + 10
    while _count(hop, f"{names.REQUESTS}") < 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _count(hop, names.REQUESTS, code="200", stream="true") == 1
    assert _count(hop, names.REQUESTS, code="client_closed") == 0
    assert _count(hop, f"{names.TTFT}_count") == 1
    assert _count(hop, f"{names.ITL}_count") == 3  # four tokens, three gaps
