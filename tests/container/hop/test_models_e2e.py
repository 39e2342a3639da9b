"""The model names through the hop as an instance starts it (`python -m gguf_serve.container.hop --spec ...`, the
key from the environment) in front of the real llama-server and the real Gemma 3 270M GGUF, asked by the OpenAI
client: another model's name is refused 404 model_not_found, its own names (llama-server's --alias and an alias the
spec lists) are answered by llama-server, and the model list holds exactly those names."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.local.process import free_port
from tests.committed import local_profile
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e]
ALIAS = "gemma-small"


@pytest.fixture
def hop(local_server, tmp_path: Path):
    url, key = local_server
    runtime = local_profile().runtime()
    spec = replace(runtime, model=replace(runtime.model, aliases=(ALIAS,)))
    (path := tmp_path / "runtime.json").write_text(spec.to_json())
    port = free_port()
    env = {**os.environ, "LLAMA_API_KEY": key, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}",
                             "--upstream", url, "--spec", str(path), "--api-key-env", "LLAMA_API_KEY",
                             "--gpu-metrics", "off"], env=env, stderr=subprocess.PIPE, text=True)  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
        time.sleep(0.1)
    yield base, key, spec.model.name
    proc.terminate()
    proc.wait(10)


def test_the_openai_client_gets_its_models_and_a_refusal_for_another(hop):
    import openai

    base, key, name = hop
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)
    assert [m.id for m in client.models.list()] == [name, ALIAS]
    for asked in (name, ALIAS):
        answer = client.chat.completions.create(model=asked, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
        assert answer.usage.completion_tokens > 0
    with pytest.raises(openai.NotFoundError) as refused:
        client.chat.completions.create(model="Qwen3.6-27B", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert refused.value.code == "model_not_found"
    assert name in refused.value.message and ALIAS in refused.value.message
    with pytest.raises(openai.NotFoundError):  # a stream is refused the same way, before any byte of it
        client.chat.completions.create(model="Qwen3.6-27B", messages=[{"role": "user", "content": "Hi"}],
                                       max_tokens=4, stream=True)  # fmt: skip


def _counter(text: str, name: str) -> float:
    return sum(float(line.split()[-1]) for line in text.splitlines() if line.split(" ")[0] == name)


def test_the_cost_per_token_from_the_real_servers_counters_matches_the_hand_computation(hop):
    """The dashboard's denominator, end to end: the hop's output-token counter moves by what the OpenAI client was
    told it got (usage.completion_tokens) and by what llama-server counted; the dashboard's expression over it gives
    the yuan per million a hand computation gives from the catalog's price."""
    import openai

    from gguf_serve.container.hop import names as hop_names
    from gguf_serve.container.metrics.derive import LLAMA_TOKENS_PREDICTED
    from stacks.fleet_cost import HOUR, cost_basis
    from tests.committed import profile_by_stack
    from tests.stacks.constructs.test_fleet_cost import evaluate

    base, key, name = hop
    client = openai.OpenAI(base_url=f"{base}/v1", api_key=key, max_retries=0)

    def metrics() -> str:
        request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            return r.read().decode()

    before = metrics()
    told = 0
    for stream in (False, True, False):
        asked = {"model": name, "messages": [{"role": "user", "content": "Count to five."}], "max_tokens": 16}
        if stream:
            chunks = list(client.chat.completions.create(**asked, stream=True, stream_options={"include_usage": True}))
            told += next(c.usage.completion_tokens for c in chunks if c.usage is not None)
        else:
            told += client.chat.completions.create(**asked).usage.completion_tokens
    after = metrics()
    counted = _counter(after, hop_names.OUTPUT_TOKENS) - _counter(before, hop_names.OUTPUT_TOKENS)
    server = _counter(after, LLAMA_TOKENS_PREDICTED) - _counter(before, LLAMA_TOKENS_PREDICTED)
    assert told > 0 and counted == told == server, (counted, told, server)

    profile = profile_by_stack("GravitonMoeStack")  # priced as if this hour ran on one c8g.4xlarge
    basis = cost_basis(profile, profile.hardware)
    per_million = evaluate(basis.per_million("units_h", "tokens_h", HOUR), {"units_h": 1, "tokens_h": counted})
    by_hand = 9069 / 12 / (30 * 24) * 1e6 / counted  # RI / 12 months / hours in the report's month, per token
    assert per_million == pytest.approx(by_hand)
