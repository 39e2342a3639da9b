"""An instance's use of an image, run here: `launcher fetch`, then `serve` and the hop as the units run them."""

from __future__ import annotations

import json
import os
import secrets
import time
import urllib.error
import urllib.request
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.catalog.images import IMAGE_TARGETS
from gguf_serve.container.hop import names as hop_names
from tests.images.engine import docker

UID = "10001"


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def run_as_the_instance_does(
    image: str,
    gemma_gguf: Path,
    tmp_path: Path,
    *,
    target: str = "x86-64-cpu",
    load_timeout: float = 180,
    emulated: bool = False,
) -> str:
    """fetch, then serve and the hop as the units do; /health 503 then 200, a chat, histograms, HEALTHCHECK, stop.

    emulated: the image runs under QEMU, where Python alone takes 4-7 s to start on this loaded 2-core machine
    (50 ms natively): the image's HEALTHCHECK command runs unchanged, with a timeout and interval that allow for
    the emulator (docker run --health-*) instead of the image's 5 s, which no emulated Python start meets.

    Returns the server container's log (llama-server's system info, the backend it loaded)."""
    from openai import OpenAI

    from gguf_serve.local.hub import LocalScope
    from gguf_serve.local.process import free_port
    from tests.committed import local_profile

    port = free_port()
    profile = local_profile(port=port)
    # In the container the server listens on every interface, as on an instance; -p publishes it on loopback.
    image_target = IMAGE_TARGETS[target]
    profile = replace(
        profile,
        server=replace(profile.server, host="0.0.0.0"),
        hardware=replace(profile.hardware, architecture=image_target.architecture),
        image=image_target,
    )
    config = tmp_path / "etc"
    config.mkdir()
    (config / "runtime.json").write_text(profile.runtime_json())
    models = tmp_path / "models"
    models.mkdir()
    os.chown(models, int(UID), int(UID))

    with LocalScope() as hub:
        hub.add_file(profile.model.repo, profile.model.file, gemma_gguf)
        fetched = docker(
            "run", "--rm", "--network", "host", "--user", UID, "-e", "AWS_REGION=cn-northwest-1",
            "-v", f"{config}:/etc/gguf-serve:ro", "-v", f"{models}:/models", image,
            "fetch", "--spec", "/etc/gguf-serve/runtime.json", "--model-dir", "/models",
            "--endpoint", hub.url, "--connections", "4",
            check=False, timeout=600,
        )  # fmt: skip
    assert fetched.returncode == 0, fetched.stdout + fetched.stderr
    assert (models / profile.model.local_name).stat().st_size == profile.model.size_bytes

    key = secrets.token_urlsafe(24)
    name = f"gguf-serve-tier-{secrets.token_hex(4)}"
    upstream, hop_port = free_port(), free_port()
    url = f"http://127.0.0.1:{hop_port}"  # clients reach the hop; llama-server is published on loopback only
    health_timing = ["--health-timeout", "180s", "--health-interval", "20s"] if emulated else []
    docker(
        "run", "-d", "--name", name, *health_timing, "--user", UID, "-e", f"LLAMA_API_KEY={key}",
        "-p", f"127.0.0.1:{upstream}:{port}", "-v", f"{models}:/models:ro", "-v", f"{config}:/etc/gguf-serve:ro",
        image, "serve", "--spec", "/etc/gguf-serve/runtime.json", "--model-dir", "/models",
    )  # fmt: skip
    docker(
        "run", "-d", "--name", f"{name}-hop", "--network", "host", "--user", UID, "--entrypoint", "python3",
        image, "-m", "gguf_serve.container.hop", "--gpu-metrics", "off", "--listen", f"127.0.0.1:{hop_port}",
        "--upstream", f"http://127.0.0.1:{upstream}", "--no-api-key", "the image test (loopback)",
    )  # fmt: skip
    try:
        statuses: list[int] = []
        deadline = time.monotonic() + load_timeout
        while time.monotonic() < deadline and (not statuses or statuses[-1] != 200):
            status = _health(url)
            if status is not None and (not statuses or statuses[-1] != status):
                statuses.append(status)
            time.sleep(0.01)
        logs = docker("logs", name, check=False).stderr
        assert statuses and statuses[-1] == 200, logs[-3000:]
        # 502 from the hop until llama-server listens (the ALB counts it unhealthy, as it should), then 503 while
        # the model loads, then 200.
        answered = [status for status in statuses if status != 502]
        assert answered[0] == 503, f"{statuses}: /health answered 200 before the model had loaded?"
        assert 502 not in statuses[statuses.index(answered[0]) :], statuses

        client = OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model=profile.model.local_name,
            messages=[{"role": "user", "content": "Say hello in one word."}],
            max_tokens=16,
        )
        assert reply.choices[0].message.content and reply.usage.completion_tokens > 0
        with pytest.raises(urllib.error.HTTPError) as denied:
            urllib.request.urlopen(urllib.request.Request(f"{url}/v1/models"), timeout=10)
        assert denied.value.code == 401
        scrape = urllib.request.Request(f"{url}/metrics", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(scrape, timeout=10) as r:
            metrics = r.read().decode()
        assert "llamacpp:" in metrics  # llama-server's own, through the hop
        # The one chat above, timed by the hop in the image (its histograms, llama-server's per-request timings).
        assert f"{hop_names.TTFT}_count 1\n" in metrics, metrics[-2000:]
        assert f'{hop_names.REQUESTS}{{code="200",stream="false"}} 1' in metrics

        assert docker("exec", name, "id", "-u").stdout.strip() == UID
        # The first check runs after --interval (15 s); emulated, a check may take minutes.
        deadline = time.monotonic() + (600 if emulated else 60)
        health = ""
        while time.monotonic() < deadline and health != "healthy":
            health = docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip()
            time.sleep(1)
        probes = docker("inspect", "-f", "{{json .State.Health.Log}}", name).stdout.strip()
        assert health == "healthy", probes[-2000:]

        started = time.monotonic()
        docker("stop", "-t", "30", name)  # the systemd unit's ExecStop
        stopped_in = time.monotonic() - started
        state = json.loads(docker("inspect", name).stdout)[0]["State"]
        assert stopped_in < 10, f"docker stop took {stopped_in:.1f} s: SIGTERM was not handled"
        assert state["ExitCode"] in (0, 143), state
        assert not state["OOMKilled"]
        out = docker("logs", name, check=False)
        return out.stdout + out.stderr
    finally:
        docker("rm", "-f", name, f"{name}-hop", check=False)
