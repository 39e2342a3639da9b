"""The workstation's observability/compose.yaml against what `gguf-serve-workstation up` sets and what the image and
launcher expect.

`docker compose` is not installed here and the stack needs an NVIDIA GPU, so the file is parsed and its wiring
checked; `docker compose config` runs too when the plugin is on this machine. scripts/gpu-check.sh runs it for real.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest
import yaml

from gguf_serve.container import names
from gguf_serve.local.workstation import compose
from gguf_serve.local.workstation.prepare import SPEC_NAME, Workdir
from tests.conftest import ROOT

DOC = yaml.safe_load(compose.COMPOSE_FILE.read_text())
TEXT = compose.COMPOSE_FILE.read_text()


def test_every_variable_is_set_by_the_command_or_has_a_default(tmp_path):
    env = compose.environment(Workdir(tmp_path), image="img", port=8080, prometheus_port=9090)
    for name, default in re.findall(r"\$\{([A-Z_]+)(:-[^}]*)?", TEXT):
        assert name in env or default, f"${{{name}}} is neither set by workstation up nor defaulted"


def test_server_runs_the_launcher_with_the_runtime_spec_on_the_gpu():
    server = DOC["services"]["server"]
    assert server["command"] == ["serve", "--spec", names.RUNTIME_SPEC_PATH, "--model-dir", names.CONTAINER_MODEL_DIR]
    assert f"{names.CONFIG_DIR}/{SPEC_NAME}" == names.RUNTIME_SPEC_PATH  # the file workstation up writes
    assert f"${{GGUF_SERVE_CONFIG}}:{names.CONFIG_DIR}:ro" in server["volumes"]
    assert any(v.endswith(f":{names.CONTAINER_MODEL_DIR}:ro") for v in server["volumes"])
    assert server["env_file"].endswith("/api.env")
    (device,) = server["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert "ports" not in server  # reached only through the hop


def test_hop_fronts_the_server_and_prometheus_scrapes_the_hop_with_the_key():
    hop = DOC["services"]["hop"]
    assert hop["entrypoint"][-2:] == ["-m", "gguf_serve.container.hop"]
    assert hop["command"][hop["command"].index("--upstream") + 1] == f"http://server:{names.SERVER_PORT}"
    assert hop["ports"] == [f"127.0.0.1:${{GGUF_SERVE_PORT:-{names.SERVER_PORT}}}:{names.SERVER_PORT}"]
    prom = DOC["services"]["prometheus"]
    assert "${GGUF_SERVE_CONFIG}/api-key:/run/secrets/api-key:ro" in prom["volumes"]
    assert prom["user"].startswith("${GGUF_SERVE_UID")  # the 0600 key file is the workstation user's
    config = yaml.safe_load((compose.COMPOSE_FILE.parent / "prometheus.yml").read_text())
    job = config["scrape_configs"][0]
    assert job["authorization"]["credentials_file"] == "/run/secrets/api-key"
    assert job["static_configs"][0]["targets"] == [f"hop:{names.SERVER_PORT}"]
    for rule in config["rule_files"]:
        assert (compose.COMPOSE_FILE.parent / "rules" / rule.rsplit("/", 1)[1]).is_file()


def test_the_default_image_is_the_one_gpu_check_builds():
    script = (ROOT / "scripts" / "gpu-check.sh").read_text()
    # gpu-check builds the CUDA image under its content tag, then names it what the workstation runs by default.
    assert 'IMAGE_TAG="$image_tag"' in script and 'image="gguf-serve-test/cuda:$image_tag"' in script
    assert f'docker tag "$image" {compose.DEFAULT_IMAGE}' in script
    assert f"${{GGUF_SERVE_IMAGE:-{compose.DEFAULT_IMAGE}}}" in TEXT


@pytest.mark.skipif(
    subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode != 0
    if shutil.which("docker")
    else True,
    reason="the docker compose plugin is not installed here",
)
def test_docker_compose_config_accepts_it(tmp_path):
    env = compose.environment(Workdir(tmp_path), image="img", port=8080, prometheus_port=9090)
    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "api.env").write_text("LLAMA_API_KEY=x\n")
    out = subprocess.run(
        ["docker", "compose", "-f", str(compose.COMPOSE_FILE), "config"],
        env={**env, "PATH": "/usr/bin:/usr/local/bin"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 0, out.stderr
