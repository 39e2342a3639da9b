"""One endpoint for two models, locally: two real llama-servers with two different GGUFs (the Gemma 3 270M, and
the 0.9 MB random Qwen3.6-architecture file of tests/rehearsal/tiny_mtp.py), each behind its hop started as an
instance starts it (`python -m gguf_serve.container.hop`), each hop routing the other's model to the other (as each
fleet's hop routes to the shared load balancer, whose header rule picks the fleet). The OpenAI client with one base
URL reaches each model by name; a stream through the forward matches the same stream asked directly; the wrong name
is refused; the load lands on the fleet that served it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gguf_serve.container.hop import names as hop_names
from gguf_serve.local.process import free_port
from tests.conftest import ROOT

pytestmark = [pytest.mark.e2e]
TINY = "Qwen3.6-Tiny"


def _wait(url: str, proc: subprocess.Popen, what: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, f"{what} did not come up"
        time.sleep(0.2)


def _hop(port: int, upstream: str, key: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "LLAMA_API_KEY": key, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}",
                             "--upstream", upstream, "--api-key-env", "LLAMA_API_KEY", "--gpu-metrics", "off", *args],
                            env=env, stderr=subprocess.DEVNULL)  # fmt: skip


@pytest.fixture
def two_fleets(local_server, llama_server_binary, tmp_path: Path):
    from tests.committed import local_profile
    from tests.rehearsal import tiny_mtp

    gemma_url, key = local_server
    tiny_port, a_port, b_port = free_port(), free_port(), free_port()
    tiny = subprocess.Popen([str(llama_server_binary), "-m", str(tiny_mtp.write(tmp_path / "tiny.gguf")),
                             "--host", "127.0.0.1", "--port", str(tiny_port), "--alias", TINY, "-np", "1", "-c", "512",
                             "--api-key", key, "--metrics", "-t", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    (spec := tmp_path / "gemma.json").write_text(local_profile().runtime().to_json())
    gemma = local_profile().model.name
    a = _hop(a_port, gemma_url, key, "--spec", str(spec), "--route", f"{TINY}=http://127.0.0.1:{b_port}")
    b = _hop(b_port, f"http://127.0.0.1:{tiny_port}", key, "--served-model", TINY,
             "--route", f"{gemma}=http://127.0.0.1:{a_port}")  # fmt: skip
    procs = [tiny, a, b]
    try:
        _wait(f"http://127.0.0.1:{tiny_port}", tiny, "the tiny llama-server")
        _wait(f"http://127.0.0.1:{a_port}", a, "hop A")
        _wait(f"http://127.0.0.1:{b_port}", b, "hop B")
        yield f"http://127.0.0.1:{a_port}", f"http://127.0.0.1:{b_port}", key, gemma
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            p.wait(10)


def _metrics(base: str, key: str) -> dict[str, float]:
    request = urllib.request.Request(f"{base}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(request, timeout=10) as r:
        text = r.read().decode()
    wanted = (hop_names.OUTPUT_TOKENS, hop_names.ROUTED, hop_names.SHED)
    return {n: sum(float(x.split()[-1]) for x in text.splitlines() if x.split(" ")[0] == n) for n in wanted}


def test_one_base_url_reaches_each_model_and_a_forwarded_stream_matches_a_direct_one(two_fleets):
    import openai

    a, b, key, gemma = two_fleets
    shared = openai.OpenAI(base_url=f"{a}/v1", api_key=key, max_retries=0)
    direct = openai.OpenAI(base_url=f"{b}/v1", api_key=key, max_retries=0)
    assert [m.id for m in shared.models.list()] == [gemma, TINY]

    def ask(client, model: str) -> tuple[str, int]:
        chunks = list(client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": "Say something."}], max_tokens=12, temperature=0,
            seed=7, stream=True, stream_options={"include_usage": True},
        ))  # fmt: skip
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return text, next(c.usage.completion_tokens for c in chunks if c.usage is not None)

    before_a, before_b = _metrics(a, key), _metrics(b, key)
    through, through_tokens = ask(shared, TINY)  # forwarded by A to B
    straight, _ = ask(direct, TINY)
    assert through_tokens > 0 and through == straight  # greedy decoding: the same tokens either way
    assert ask(shared, gemma)[1] > 0  # served by A's own llama-server
    after_a, after_b = _metrics(a, key), _metrics(b, key)
    assert after_a[hop_names.ROUTED] - before_a[hop_names.ROUTED] == 1
    # The load lands on the fleet that served: B counted the forwarded and the direct stream's tokens, A its own.
    assert after_b[hop_names.OUTPUT_TOKENS] - before_b[hop_names.OUTPUT_TOKENS] == 2 * through_tokens
    assert after_a[hop_names.OUTPUT_TOKENS] > before_a[hop_names.OUTPUT_TOKENS]

    with pytest.raises(openai.NotFoundError) as refused:
        shared.chat.completions.create(model="Llama-4", messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
    assert refused.value.code == "model_not_found" and TINY in refused.value.message
