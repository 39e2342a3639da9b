"""Against the real llama-server (session fixture local_server: --metrics and an API key), into moto's CloudWatch."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.derive import LLAMA_REQUESTS_PROCESSING
from gguf_serve.container.metrics.publish import Publisher
from gguf_serve.container.metrics.scrape import ApiKeySource, fetch_total_slots, scrape_metrics
from tests.container.metrics.conftest import GROUP, INSTANCE, datapoints, dimension_sets

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[3]
INSTANCE_ONLY = {names.DIM_GROUP: GROUP, names.DIM_INSTANCE: INSTANCE}


class RecordingClock:
    def __init__(self) -> None:
        self.readings: list[float] = []

    def __call__(self) -> float:
        self.readings.append(time.monotonic())
        return self.readings[-1]


def chat(url: str, key: str, prompt: str, max_tokens: int) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=120) as response:
        return json.loads(response.read())


def test_one_chat_request_shows_as_load_and_tokens_per_second(local_server, cloudwatch, monkeypatch):
    url, key = local_server
    monkeypatch.setenv("E2E_LLAMA_KEY", key)
    clock = RecordingClock()
    pub = Publisher(
        cloudwatch=cloudwatch,
        namespace=names.NAMESPACE,
        group=GROUP,
        instance_id=INSTANCE,
        base_url=url,
        api_key=ApiKeySource(env_name="E2E_LLAMA_KEY"),
        clock=clock,
    )
    first = {d.name: d.value for d in pub.step()}
    slots = fetch_total_slots(url, key)
    assert first[names.REQUESTS_PROCESSING] == 0
    assert first[names.SLOTS_BUSY_RATIO] == 0
    assert first[names.SCRAPE_FAILED] == 0
    assert names.GENERATED_TPS not in first

    answer: dict = {}
    worker = threading.Thread(
        target=lambda: answer.update(chat(url, key, "Count slowly from one to fifty in words.", 16))
    )
    worker.start()
    in_flight = []
    while worker.is_alive():
        in_flight.append(scrape_metrics(url, key).families[LLAMA_REQUESTS_PROCESSING].value())
        time.sleep(0.02)
    worker.join()
    assert max(in_flight) == 1, in_flight  # the one request held one slot while it ran

    second = {d.name: d.value for d in pub.step()}
    elapsed = clock.readings[-1] - clock.readings[0]
    generated = answer["usage"]["completion_tokens"]
    assert generated > 0
    assert second[names.GENERATED_TPS] > 0
    assert second[names.GENERATED_TPS] * elapsed == pytest.approx(generated)
    assert second[names.PROMPT_TPS] * elapsed == pytest.approx(answer["timings"]["prompt_n"])
    assert second[names.REQUESTS_PROCESSING] == 0 and second[names.REQUESTS_DEFERRED] == 0
    assert names.DRAFT_ACCEPTANCE not in second  # no speculative decoding on this server

    (point,) = datapoints(cloudwatch, names.NAMESPACE, names.GENERATED_TPS, INSTANCE_ONLY)
    assert point["Maximum"] == pytest.approx(generated / elapsed)
    assert point["Unit"] == "Count/Second"
    assert dimension_sets(cloudwatch, names.NAMESPACE, names.REQUESTS_PROCESSING) == [
        {names.DIM_GROUP: GROUP},
        INSTANCE_ONLY,
    ]
    (point,) = datapoints(cloudwatch, names.NAMESPACE, names.SLOTS_BUSY_RATIO, INSTANCE_ONLY)
    assert point["Unit"] == "Percent" and point["Maximum"] == 0 and slots >= 1


@pytest.mark.parametrize("key_source", [ApiKeySource(), ApiKeySource(env_name="E2E_WRONG_KEY")], ids=["none", "wrong"])
def test_scrape_without_the_key_is_refused_and_reported(local_server, cloudwatch, monkeypatch, caplog, key_source):
    url, _ = local_server
    monkeypatch.setenv("E2E_WRONG_KEY", "not-the-key")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"{url}/metrics", timeout=10)
    assert refused.value.code == 401

    pub = Publisher(
        cloudwatch=cloudwatch,
        namespace=names.NAMESPACE,
        group=GROUP,
        instance_id=INSTANCE,
        base_url=url,
        api_key=key_source,
    )
    with caplog.at_level(logging.WARNING, logger="gguf-serve-metrics"):
        assert [(d.name, d.value) for d in pub.step()] == [(names.SCRAPE_FAILED, 1.0)]
    assert f"scrape failed: GET {url}/metrics: HTTP 401 Invalid API Key" in caplog.text
    for dims in ({names.DIM_GROUP: GROUP}, INSTANCE_ONLY):
        (point,) = datapoints(cloudwatch, names.NAMESPACE, names.SCRAPE_FAILED, dims)
        assert point["Maximum"] == 1.0


def test_cli_once_with_key_file_against_the_real_server(local_server, tmp_path):
    url, key = local_server
    key_file = tmp_path / "api.env"
    key_file.write_text(f"LLAMA_API_KEY={key}\n")
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.metrics", "--url", url, "--api-key-env-file", str(key_file),
         "--group", GROUP, "--instance-id", INSTANCE, "--once", "--dry-run"],
        capture_output=True, text=True, timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "RequestsProcessing=0 SlotsBusyRatio=0 RequestsDeferred=0 ScrapeFailed=0" in out.stderr
    assert key not in out.stderr
