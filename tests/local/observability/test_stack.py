"""The local observability stack on CPU, for real: llama-server (through the launcher, the small Gemma GGUF),
the timing hop in front of it, and Prometheus from Debian scraping the hop with the API key and evaluating the
committed rules. Requests go through the OpenAI client; the percentiles are read back from Prometheus's API.

Prometheus's configuration is the committed observability/prometheus.yml (in gguf_serve/local/workstation/) with
the targets, the key file and the intervals (1 s here) swapped: the same job, the same rules and the same
authorization as the Compose stack.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

from gguf_serve.container.hop import names
from gguf_serve.local.process import PACKAGE_ROOT, free_port

from .conftest import OBSERVABILITY

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_TOKENS = 24


def _wait(check, timeout: float, what: str, seen=None):
    """check() until truthy; on a timeout the message carries what `seen()` (or check()) last answered."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.25)
    last = (seen or check)()
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what} (last seen: {last!r})")


class Prometheus:
    def __init__(self, url: str) -> None:
        self.url = url

    def query(self, promql: str) -> list[dict]:
        q = urllib.parse.urlencode({"query": promql})
        with urllib.request.urlopen(f"{self.url}/api/v1/query?{q}", timeout=10) as r:
            doc = json.load(r)
        assert doc["status"] == "success", doc
        return doc["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        result = self.query(promql)
        return float(result[0]["value"][1]) if result else None


@pytest.fixture(scope="module")
def stack(local_server, prometheus_bin, tmp_path_factory):
    """(hop URL, API key, Prometheus) with the hop and Prometheus as child processes."""
    url, key = local_server
    work = tmp_path_factory.mktemp("observability")
    hop_port, prom_port = free_port(), free_port()
    hop = subprocess.Popen(
        [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{hop_port}", "--upstream", url,
         "--gpu-metrics", "off", "--no-api-key", "the test (loopback)"],
        env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)},
        stdout=(work / "hop.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    (work / "api-key").write_text(key)
    (work / "wrong-key").write_text("not-the-key")
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s"}
    config["rule_files"] = [str(OBSERVABILITY / "rules" / Path(f).name) for f in config["rule_files"]]
    job = config["scrape_configs"][0]
    job["authorization"]["credentials_file"] = str(work / "api-key")
    job["static_configs"] = [{"targets": [f"127.0.0.1:{hop_port}"]}]
    wrong = json.loads(json.dumps(job))  # the same job with a wrong key: the hop must refuse it
    wrong["job_name"] = "wrong-key"
    wrong["authorization"]["credentials_file"] = str(work / "wrong-key")
    config["scrape_configs"].append(wrong)
    (work / "prometheus.yml").write_text(json.dumps(config))  # JSON is YAML
    prom = subprocess.Popen(
        [str(prometheus_bin["prometheus"]), f"--config.file={work / 'prometheus.yml'}",
         f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
        stdout=(work / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        p = Prometheus(f"http://127.0.0.1:{prom_port}")

        def scraped() -> bool:
            try:
                return p.scalar('up{job="gguf-serve"}') == 1
            except OSError:
                return False

        _wait(scraped, 60, "Prometheus to scrape the hop once (log: %s)" % (work / "prometheus.log"))
        yield f"http://127.0.0.1:{hop_port}", key, p
    finally:
        for proc in (prom, hop):
            proc.terminate()
            proc.wait(15)


def _streamed(client, i: int) -> float:
    """Client-side TTFT of one streamed chat request."""
    start = time.monotonic()
    first = None
    for event in client.chat.completions.create(
        model="m",
        messages=[{"role": "user", "content": f"({i}) Name three uses of a hash table."}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        stream=True,
    ):
        if first is None and event.choices and event.choices[0].delta.content:
            first = time.monotonic() - start
    assert first is not None
    return first


def _bucket_bounds(value: float, bounds: tuple[float, ...]) -> tuple[float, float]:
    i = bisect.bisect_left(bounds, value)
    return (bounds[i - 1] if i else 0.0), (bounds[i] if i < len(bounds) else math.inf)


def test_percentiles_reach_prometheus(stack) -> None:
    from openai import OpenAI

    hop_url, key, prom = stack
    started = time.monotonic()
    client = OpenAI(base_url=f"{hop_url}/v1", api_key=key, max_retries=0)
    client_ttft = [_streamed(client, i) for i in range(6)]
    with ThreadPoolExecutor(4) as pool:  # four at once on two slots: two of them queue
        client_ttft += list(pool.map(lambda i: _streamed(client, i), range(6, 10)))
    whole = []  # non-streamed: the client sees only the whole answer, which bounds the hop's TTFT estimate
    for i in range(2):
        begun = time.monotonic()
        reply = client.chat.completions.create(
            model="m", messages=[{"role": "user", "content": f"({i}) Say hello."}], max_tokens=MAX_TOKENS
        )
        whole.append(time.monotonic() - begun)
        assert reply.choices[0].message.content
    refused = OpenAI(base_url=f"{hop_url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(Exception, match="401"):
        refused.chat.completions.create(model="m", messages=[{"role": "user", "content": "x"}], max_tokens=4)
    sent_s = time.monotonic() - started

    observed = f'sum({names.TTFT}_count{{job="gguf-serve"}})'
    count = _wait(lambda: prom.scalar(f"{observed} == 12"), 30, "12 TTFT observations", lambda: prom.scalar(observed))
    assert count == 12
    assert prom.scalar(f'sum({names.REQUESTS}{{code="200"}})') == 12
    assert _wait(lambda: prom.scalar(f'sum({names.REQUESTS}{{code="401"}})'), 10, "the refused request") == 1
    assert prom.scalar('up{job="wrong-key"}') == 0, "the hop served /metrics to a wrong key"

    def q(metric: str, quantile: float) -> float:  # over every observation so far: no rate-window guesswork
        value = prom.scalar(f'histogram_quantile({quantile}, sum by (le) ({metric}_bucket{{job="gguf-serve"}}))')
        assert value is not None and math.isfinite(value), metric
        return value

    read = {m: {p: q(m, p) for p in (0.5, 0.95, 0.99)} for m in (names.TTFT, names.ITL, names.QUEUE_WAIT,
                                                                   names.DECODE_TPS)}  # fmt: skip
    print(f"\n{len(client_ttft) + 2} requests in {sent_s:.1f} s; read back from Prometheus:")
    for metric, values in read.items():
        print(f"  {metric}: " + ", ".join(f"p{round(p * 100)} {v:.4g}" for p, v in values.items()))

    # The hop times a part of what the client times (from the request reaching it to the first token leaving
    # it), so it can never see more: its median is at most the client's median bucket, and its sum at most the
    # client's sum. How much less depends on the client's own overhead, which load on a 2-core machine inflates.
    bounds = names.BUCKETS[names.TTFT]
    client_p50 = sorted(client_ttft)[len(client_ttft) // 2]
    _, high = _bucket_bounds(client_p50, bounds)
    assert 0 < read[names.TTFT][0.5] <= high, (client_p50, read[names.TTFT])
    hop_sum = prom.scalar(f'sum({names.TTFT}_sum{{job="gguf-serve"}})')
    client_sum = sum(client_ttft) + sum(whole)
    assert hop_sum is not None and 0 < hop_sum <= client_sum + 0.05, (hop_sum, client_sum)
    for values in read.values():
        assert values[0.5] <= values[0.95] <= values[0.99]
    assert 0 < read[names.ITL][0.5] < 2
    assert 0 < read[names.DECODE_TPS][0.5] < 1000  # a plausible speed, not a target (a loaded machine is slow)
    # two of the four concurrent requests waited for a slot for at least part of another's generation
    waited = prom.scalar(f'sum({names.QUEUE_WAIT}_count) - sum({names.QUEUE_WAIT}_bucket{{le="0.05"}})')
    assert waited is not None and waited >= 1
    assert prom.scalar(f"sum({names.DRAFT_ACCEPTANCE}_count)") == 0  # Gemma has no MTP layers: no drafts

    # The committed recording rules evaluate on the same data.
    recorded = _wait(
        lambda: prom.scalar("job:gguf_serve_time_to_first_token_seconds:p95_5m"), 20, "the recording rules"
    )
    assert math.isfinite(recorded) and recorded > 0
    assert prom.scalar("job:gguf_serve_decode_tokens_per_second:p50_5m") > 0
    assert prom.scalar('job:gguf_serve_requests:rate5m{code="200"}') > 0
    print(f"  recorded job:gguf_serve_time_to_first_token_seconds:p95_5m = {recorded:.4g}")
