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
