"""`gguf-serve-workstation up --native --cpu` end to end, for real: a catalog workstation profile (the small Gemma
GGUF on a test card) fetched by the launcher from a ModelScope-shaped server, the real llama-server through the
launcher, the hop and Debian's Prometheus, all started by the one command; then a chat through the hop with the
OpenAI client, the hop's histograms, a Prometheus scrape, and SIGTERM stopping all three."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from gguf_serve.local.hub.server import LocalScope
from gguf_serve.local.process import PACKAGE_ROOT, free_ports
from tests.local.observability.conftest import prometheus_bin  # noqa: F401 - the fixture
from tests.local.observability.test_stack import Prometheus, _wait

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

CARD = """
[workstation."test-card"]
gpu = "a test card (the run uses --cpu)"
gpu_memory_gib = 8.0
memory_gib = 8.0
vcpus = 2
physical_cores = 2
cpu = "this machine"
"""
PROFILE = """workstation = "test-card"
model = "Gemma-3-270M"
description = "the small Gemma GGUF: the path, not the model"

[server]
ctx_per_slot = 2048
parallel = 2
cache_ram_mib = 256
"""


def test_one_command_brings_up_server_hop_and_prometheus(tmp_path: Path, llama_server_binary, gemma_gguf,
                                                         prometheus_bin):  # noqa: F811  # fmt: skip
    from openai import OpenAI

    profiles = Path(shutil.copytree(PACKAGE_ROOT / "profiles", tmp_path / "profiles"))
    with (profiles / "hardware.toml").open("a") as f:
        f.write(CARD)
    (profiles / "workstation" / "gemma-test.toml").write_text(PROFILE)
    port, server_port, prom_port = free_ports(3)  # distinct and free: the default --port + 1 may be taken
    work = tmp_path / "work"
    started = time.monotonic()
    with LocalScope() as hub:
        hub.add_file("local/gemma-3-270m-GGUF", "gemma-3-270m-q4_k_m.gguf", gemma_gguf)
        up = subprocess.Popen(
            [sys.executable, "-m", "gguf_serve.local.workstation", "--profiles", str(profiles), "up", "gemma-test",
             "--native", "--cpu",
             "--endpoint", hub.url, "--work-dir", str(work), "--port", str(port), "--prometheus-port", str(prom_port),
             "--server-port", str(server_port),
             "--llama-server", str(llama_server_binary), "--prometheus", str(prometheus_bin["prometheus"]),
             "--scrape-interval", "1", "--health-timeout", "120"],
            cwd=PACKAGE_ROOT, env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT)},
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        lines = []
        try:
            for line in up.stdout:
                lines.append(line)
                if "workstation: ready" in line or up.poll() is not None:
                    break
            assert "workstation: ready" in lines[-1], "".join(lines)
            ready_s = time.monotonic() - started
            url, key = f"http://127.0.0.1:{port}", (work / "config" / "api-key").read_text()
            assert oct((work / "config" / "api-key").stat().st_mode & 0o777) == "0o600"
            with urllib.request.urlopen(f"{url}/health", timeout=5) as r:
                assert r.status == 200

            client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
            reply = client.chat.completions.create(
                model="Gemma-3-270M", messages=[{"role": "user", "content": "Say hello."}], max_tokens=16
            )
            assert reply.choices[0].message.content
            streamed = "".join(
                e.choices[0].delta.content or ""
                for e in client.chat.completions.create(
                    model="Gemma-3-270M", messages=[{"role": "user", "content": "Count to five."}],
                    max_tokens=16, stream=True,
                )
                if e.choices
            )  # fmt: skip
            assert streamed

            req = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"})
            with urllib.request.urlopen(req, timeout=10) as r:
                metrics = r.read().decode()
            for family in ("time_to_first_token_seconds", "inter_token_latency_seconds", "queue_wait_seconds",
                           "decode_tokens_per_second"):  # fmt: skip
                assert f"gguf_serve_{family}_bucket" in metrics, family
            assert "gguf_serve_time_to_first_token_seconds_count 2" in metrics
            assert "llamacpp:" in metrics  # llama-server's own families, through the hop

            prom = Prometheus(f"http://127.0.0.1:{prom_port}")
            count = _wait(lambda: prom.scalar("sum(gguf_serve_time_to_first_token_seconds_count) == 2"), 30,
                          "Prometheus to scrape the hop's histograms")  # fmt: skip
            assert count == 2
            spec = (work / "config" / "runtime.json").read_text()
            assert '"gpu_layers": 0' in spec and (work / "models" / "gemma-3-270m-q4_k_m.gguf").is_file()
        finally:
            up.send_signal(signal.SIGTERM)
            rest = up.communicate(timeout=60)[0]
        assert up.returncode == 0, "".join(lines) + rest
        assert "workstation: stopped" in rest
        print(f"\nworkstation up --native --cpu: ready in {ready_s:.1f} s (fetch, llama-server, hop, Prometheus)")
    with pytest.raises(OSError):
        urllib.request.urlopen(f"{url}/health", timeout=2)  # the hop is gone
