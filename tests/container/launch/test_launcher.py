"""`gguf-serve-launch serve`: refuses bad combinations before llama-server starts, and execs it otherwise.

These run the real launcher process against tiny GGUF files and a sentinel binary that records whether it
was started; the same refusals against the real llama-server are in test_server.py.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog.images import IMAGE_TARGETS
from gguf_serve.container.launch import EX_CONFIG
from tests.committed import HARDWARE, PROFILES

GPU = PROFILES["gpu-mtp"]  # qwen35, MTP on: expects Qwen3.6-27B-Q4_K_M.gguf with MTP layers
# The GPU profile's MTP settings on a CPU host with the RAM for them: exec-path tests on a machine without a GPU.
GPU_SETTINGS_ON_CPU = dataclasses.replace(
    GPU,
    hardware=HARDWARE["c8g.4xlarge"],
    image=IMAGE_TARGETS["arm64-cpu"],
    server=dataclasses.replace(GPU.server, gpu_layers=0),
)
GRAVITON = PROFILES["graviton-moe"]  # qwen35moe, MTP off, size and sha256 pinned


def _refused(result, sentinel_record, *words: str) -> str:
    assert result.returncode == EX_CONFIG, result.stderr
    assert not sentinel_record.exists(), "llama-server was started"
    assert "refusing to start" in result.stderr
    for w in words:
        assert w in result.stderr, result.stderr
    return result.stderr


def test_missing_model_file_is_refused(tmp_path, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    result = run_launcher(GPU, tmp_path / "empty", binary)
    _refused(result, record, "missing", GPU.model.local_name, "gguf-serve-launch fetch")


def test_wrong_architecture_is_refused(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "llama", nextn_predict_layers=1)
    result = run_launcher(GPU, path.parent, binary)
    _refused(result, record, "'llama' model", "expects 'qwen35'")


def test_mtp_profile_on_a_file_without_mtp_layers_is_refused(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    # the trap from the field: the non-MTP repo ships a file of the same name
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=0)
    result = run_launcher(GPU, path.parent, binary)
    _refused(result, record, "no MTP layers", "qwen35.nextn_predict_layers is 0", "MTP-GGUF")


def test_mtp_key_absent_counts_as_no_mtp_layers(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=None)
    _refused(run_launcher(GPU, path.parent, binary), record, "no MTP layers")


def test_not_a_gguf_is_refused(tmp_path, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / GPU.model.local_name).write_bytes(b"<html>503 Service Unavailable</html>")
    _refused(run_launcher(GPU, tmp_path / "m", binary), record, "not a readable GGUF")


def test_size_differing_from_the_pinned_artifact_is_refused(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GRAVITON.model.local_name, "qwen35moe", nextn_predict_layers=0)
    _refused(run_launcher(GRAVITON, path.parent, binary), record, "22,663,387,424 bytes", "fetch again")


def test_missing_api_key_is_refused_unless_allowed(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    _refused(run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary, api_key=None), record, "LLAMA_API_KEY is not set")
    allowed = run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary, api_key=None, no_api_key=True)
    assert allowed.returncode == 0, allowed.stderr
    assert record.exists()


def test_invalid_profile_json_is_refused(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    doc = json.loads(GPU.runtime_json())
    doc["model"]["has_mtp_layers"] = False  # the catalog rejects MTP on such a model when the profile loads
    result = run_launcher(GPU, path.parent, binary, profile_text=json.dumps(doc))
    _refused(result, record, "MTP is on", "no MTP layers")


def test_accepted_profile_execs_llama_server_with_catalog_flags(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    inherited = {"LLAMA_ARG_SPEC_TYPE": "draft-mtp", "LLAMA_ARG_N_PARALLEL": "4"}
    result = run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary, api_key="s3cret-key", extra_env=inherited)
    assert result.returncode == 0, result.stderr
    argv_text, env_text = record.read_text().split("---\n")
    argv = argv_text.splitlines()
    assert argv[argv.index("--model") + 1] == str(path)
    assert argv[argv.index("--spec-type") + 1] == "draft-mtp"
    assert argv[argv.index("--spec-draft-n-max") + 1] == "2"
    assert argv[argv.index("--parallel") + 1] == "1"
    assert "s3cret-key" not in argv_text  # the key travels only in the environment
    assert "LLAMA_API_KEY=s3cret-key" in env_text.splitlines()
    assert "LLAMA_ARG_" not in env_text  # nothing inherited can add settings the profile does not have
    assert "ignoring inherited LLAMA_ARG_N_PARALLEL, LLAMA_ARG_SPEC_TYPE" in result.stdout
    assert "starting llama-server for profile 'gpu-mtp'" in result.stdout


CREDENTIALS = {  # what an instance's, a task's or a pod's environment may hold, and llama-server needs none of
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLE",
    "AWS_SECRET_ACCESS_KEY": "wJalrEXAMPLE",
    "AWS_SESSION_TOKEN": "FwoGEXAMPLE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/0a1b",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/secrets/pod-identity/token",
    "AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/irsa/token",
    "AWS_ROLE_ARN": "arn:aws-cn:iam::111122223333:role/serving",
    "MODELSCOPE_API_TOKEN": "ms-EXAMPLE",
}


def test_llama_server_gets_no_credential_only_what_it_reads(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    tuning = {"GGML_SCHED_MAX_COPIES": "1", "NVIDIA_VISIBLE_DEVICES": "all", "OMP_WAIT_POLICY": "passive"}
    result = run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary, api_key="s3cret-key",
                          extra_env={**CREDENTIALS, **tuning})  # fmt: skip
    assert result.returncode == 0, result.stderr
    env = dict(line.split("=", 1) for line in record.read_text().split("---\n")[1].splitlines() if "=" in line)
    assert not set(CREDENTIALS) & set(env), env
    assert not any(v in record.read_text() for v in CREDENTIALS.values())
    assert {k: env.get(k) for k in tuning} == tuning and env["LLAMA_API_KEY"] == "s3cret-key" and "PATH" in env
    withheld = next(line for line in result.stdout.splitlines() if "not passed to llama-server" in line)
    assert all(name in withheld for name in CREDENTIALS)
    assert not any(v in result.stdout for v in CREDENTIALS.values())  # names in the log, never values


def test_gpu_profile_without_a_visible_gpu_is_refused(make_gguf, sentinel_binary, run_launcher, tmp_path):
    from gguf_serve.container.launch import LaunchRefused, check_gpu

    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    if not any(Path("/dev").glob("nvidia[0-9]*")):  # this machine: no GPU
        _refused(run_launcher(GPU, path.parent, binary), record, "no NVIDIA device is visible", "--gpus all")
    fake_dev = tmp_path / "dev"
    fake_dev.mkdir()
    with pytest.raises(LaunchRefused):
        check_gpu(GPU, fake_dev)
    (fake_dev / "nvidia0").touch()
    check_gpu(GPU, fake_dev)  # a device is visible: no refusal
    check_gpu(PROFILES["graviton-moe"], tmp_path)  # CPU profiles never need one


def test_cpu_profile_passes_no_speculative_flags(make_gguf, sentinel_binary, run_launcher, tmp_path):
    binary, record = sentinel_binary
    local = dataclasses.replace(GRAVITON, model=dataclasses.replace(GRAVITON.model, sha256=None))
    path = make_gguf(local.model.local_name, "qwen35moe", nextn_predict_layers=1)
    result = run_launcher(local, path.parent, binary, extra_env={"LLAMA_ARG_SPEC_TYPE": "draft-mtp"})
    assert result.returncode == 0, result.stderr
    argv_text, env_text = record.read_text().split("---\n")
    assert "spec" not in argv_text and "SPEC" not in env_text


def test_health_subcommand_without_a_server_fails(tmp_path):
    from gguf_serve.container.launch.cli import main

    profile = tmp_path / "p.json"
    doc = json.loads(GPU.runtime_json())
    doc["server"]["port"] = 9  # discard: nothing listens
    profile.write_text(json.dumps(doc))
    assert main(["health", "--spec", str(profile), "--timeout", "1"]) == 1


def test_health_imports_only_the_standard_library_and_the_names(tmp_path):
    """The HEALTHCHECK runs every 15 s with a 5 s timeout, compiling what it imports each time: the full CLI
    (the fetcher, urllib3, the profiles) took about 60 s in the arm64 image under QEMU and never turned healthy."""
    spec = tmp_path / "p.json"
    spec.write_text(json.dumps({"server": {"port": 9}}))  # discard: nothing listens
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gguf_serve.container.launch", "health", "--spec", str(spec),
         "--timeout", "1"],
        capture_output=True, text=True, cwd=Path(__file__).parents[3], timeout=60,
    )  # fmt: skip
    assert out.returncode == 1, out.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in out.stderr.splitlines() if line.startswith("import time:")}
    ours = sorted(m for m in imported if m.split(".")[0] == "gguf_serve")
    expected = [
        "gguf_serve",
        "gguf_serve.container",
        "gguf_serve.container.launch",
        "gguf_serve.container.launch.health",
    ]
    assert ours == [*expected, "gguf_serve.container.names"], ours
    assert not {"urllib3", "boto3", "botocore"} & imported


def test_benchmark_mode_turns_the_prompt_cache_off(make_gguf, sentinel_binary, run_launcher):
    binary, record = sentinel_binary
    path = make_gguf(GPU.model.local_name, "qwen35", nextn_predict_layers=1)
    argv = lambda: record.read_text().split("---\n")[0].splitlines()  # noqa: E731
    assert run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary).returncode == 0
    assert argv()[argv().index("--cache-ram") + 1] == str(GPU.server.cache_ram_mib)
    assert run_launcher(GPU_SETTINGS_ON_CPU, path.parent, binary, benchmark=True).returncode == 0
    assert argv()[argv().index("--cache-ram") + 1] == "0"


@pytest.mark.e2e
def test_fetch_subcommand_delivers_the_profile_model(gemma_gguf, tmp_path):
    from gguf_serve.local.hub import LocalScope
    from gguf_serve.local.process import launcher_env
    from tests.committed import local_profile

    profile = local_profile()
    (tmp_path / "runtime.json").write_text(profile.runtime_json())
    models = tmp_path / "models"
    with LocalScope() as hub:
        hub.add_file(profile.model.repo, profile.model.file, gemma_gguf)
        out = subprocess.run(
            [sys.executable, "-m", "gguf_serve.container.launch", "fetch", "--spec", str(tmp_path / "runtime.json"),
             "--model-dir", str(models), "--endpoint", hub.url, "--connections", "4"],
            env=launcher_env(None), capture_output=True, text=True, timeout=300,
        )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    fetched = models / profile.model.local_name
    assert f"gguf-serve-launch: model ready at {fetched}" in out.stdout
    assert fetched.stat().st_size == profile.model.size_bytes
