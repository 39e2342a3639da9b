"""The real llama-server, started through the launcher with the local profile: what the load balancer,
clients and the Auto Scaling group rely on. One server is shared (tests/conftest.py `serving_process`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from gguf_serve.local.process import ServerExited, free_port, start_server
from tests.committed import MODELS, PROFILES, local_profile

pytestmark = pytest.mark.e2e


def _post(url: str, body: dict, key: str | None, timeout: float = 120) -> tuple[int, dict]:
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def _chat_body(prompt: str = "Say hello.", max_tokens: int = 16) -> dict:
    return {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}


def test_health_answers_503_while_loading_then_200(serving_process):
    # polled every 20 ms from process start: nothing listening, then 503 while the model loads, then 200
    seen = [s for s in serving_process.statuses if s is not None]
    assert seen[0] == 503, serving_process.statuses
    assert seen[-1] == 200
    assert serving_process.health() == 200


def test_health_needs_no_api_key_but_chat_does(serving_process):
    url, key = serving_process.url, serving_process.api_key
    with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
        assert r.status == 200
    status, body = _post(f"{url}/v1/chat/completions", _chat_body(), key=None)
    assert status == 401
    assert body["error"]["message"] == "Invalid API Key"
    status, _ = _post(f"{url}/v1/chat/completions", _chat_body(), key="not-the-key")
    assert status == 401
    status, body = _post(f"{url}/v1/chat/completions", _chat_body(), key=key)
    assert status == 200
    assert body["choices"][0]["message"]["content"]


def test_chat_completion_through_the_openai_client_carries_timings(serving_process):
    from openai import AuthenticationError, OpenAI

    client = OpenAI(base_url=f"{serving_process.url}/v1", api_key=serving_process.api_key, max_retries=0)
    resp = client.chat.completions.create(
        model=MODELS["Gemma-3-270M"].name,
        messages=[{"role": "user", "content": "Name a colour."}],
        max_tokens=24,
        temperature=0,
    )
    assert resp.choices[0].message.content
    assert resp.usage.completion_tokens > 0
    timings = resp.model_extra["timings"]
    for field in ("prompt_n", "prompt_per_second", "predicted_n", "predicted_ms", "predicted_per_second"):
        assert field in timings, timings
    assert timings["predicted_n"] == resp.usage.completion_tokens
    assert timings["predicted_per_second"] > 0  # a speed, not a speed target (those live in benchmarks)

    wrong = OpenAI(base_url=f"{serving_process.url}/v1", api_key="wrong", max_retries=0)
    with pytest.raises(AuthenticationError):
        wrong.chat.completions.create(model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


def _deferred(url: str, key: str) -> int:
    req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        text = r.read().decode()
    m = re.search(r"^llamacpp:requests_deferred\s+([0-9.e+]+)", text, re.M)
    return int(float(m.group(1))) if m else 0


def test_requests_beyond_the_slot_count_queue_and_all_complete(serving_process):
    url, key = serving_process.url, serving_process.api_key
    slots = local_profile().server.parallel
    n = slots + 3
    max_deferred = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal max_deferred
        while not done.is_set():
            with contextlib.suppress(OSError):  # a slow scrape under load is not what is tested
                max_deferred = max(max_deferred, _deferred(url, key))
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        with ThreadPoolExecutor(n) as pool:
            prompts = [f"Count from {i} to {i + 20}." for i in range(n)]
            results = list(pool.map(lambda p: _post(f"{url}/v1/chat/completions", _chat_body(p, 16), key), prompts))
    finally:
        done.set()
        watcher.join()
    assert [s for s, _ in results] == [200] * n  # none dropped
    assert all(b["choices"][0]["message"]["content"] for _, b in results)
    assert max_deferred >= 1, "no request waited for a slot: the test did not exceed the slot count"


def test_metrics_need_the_api_key(serving_process):
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"{serving_process.url}/metrics", timeout=5)
    assert e.value.code == 401
    assert _deferred(serving_process.url, serving_process.api_key) >= 0


def test_health_subcommand_reads_the_port_from_the_profile(serving_process):
    from gguf_serve.container.launch.cli import main

    profile_path = serving_process.log_path.parent / "runtime.json"
    assert main(["health", "--spec", str(profile_path)]) == 0


def test_gpu_profile_settings_on_a_model_without_mtp_layers_are_refused_before_start(
    llama_server_binary, gemma_gguf, tmp_path
):
    # The GPU profile's settings (MTP on, one slot, every layer on the GPU) with a model the catalog
    # believes has MTP layers, but whose file on disk has none: the launcher refuses, llama-server never runs.
    gpu = PROFILES["gpu-mtp"]
    claimed = dataclasses.replace(MODELS["Gemma-3-270M"], has_mtp_layers=True)
    profile = dataclasses.replace(gpu, model=claimed, server=dataclasses.replace(gpu.server, port=free_port()))
    start = time.monotonic()
    server = start_server(profile, gemma_gguf.parent, binary=llama_server_binary, api_key="k", workdir=tmp_path)
    with pytest.raises(ServerExited) as e:
        server.wait_healthy(timeout=60)
    assert e.value.refused
    assert "no MTP layers" in str(e.value)
    assert time.monotonic() - start < 10
    log = server.log_path.read_text()
    assert "starting llama-server" not in log and "load_model" not in log  # never started


def test_llama_server_itself_refuses_mtp_without_layers(llama_server_binary, gemma_gguf):
    # Why the check above exists: without it, llama-server loads the model and then exits 1.
    import subprocess

    out = subprocess.run(
        [str(llama_server_binary), "-m", str(gemma_gguf), "--port", str(free_port()), "-c", "512",
         "--spec-type", "draft-mtp"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "MTP" in out.stdout + out.stderr


def test_early_exit_surfaces_llama_servers_last_log_lines(llama_server_binary, gemma_gguf, tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        server = start_server(
            local_profile(port=port), gemma_gguf.parent, binary=llama_server_binary, api_key="k", workdir=tmp_path
        )
        with pytest.raises(ServerExited) as e:
            server.wait_healthy(timeout=120)
    assert not e.value.refused
    assert e.value.returncode != 0
    assert "before /health answered 200" in str(e.value)
    assert re.search(r"bind|listen|address", e.value.tail, re.I), e.value.tail
