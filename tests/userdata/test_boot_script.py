"""The rendered boot script: small enough, shellcheck clean, nothing left unrendered, MTP only where it belongs."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import jinja2
import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.container import names
from gguf_serve.container.launch.preflight import EX_CONFIG
from tests.committed import PROFILES
from userdata import BootSettings, InstanceSpec, render_user_data
from userdata.render import _ENV, USER_DATA_LIMIT

BOOT = BootSettings(
    region="cn-northwest-1",
    stack_name="GravitonMoeStack",
    group_logical_id="ServingGroup",
    image_uri="111122223333.dkr.ecr.cn-northwest-1.amazonaws.com.cn/serving:arm64-cpu-0123456789abcdef",
    registry="111122223333.dkr.ecr.cn-northwest-1.amazonaws.com.cn",
    api_key_secret_arn="arn:aws-cn:secretsmanager:cn-northwest-1:111122223333:secret:ApiKey-AbCdEf",
    model_cache_url="s3://model-cache-bucket/models/",
    log_group="/gguf-serve/GravitonMoeStack",
    metrics_namespace="GgufServe/LlamaServer",
    route_url="",
    lifecycle_hook=names.LIFECYCLE_HOOK,
    release="0123456789abcdef",
    release_parameter="/GravitonMoeStack/serving-release",
)


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_rendered_script_is_small_clean_and_complete(name, tmp_path):
    text = render_user_data(InstanceSpec.of(PROFILES[name]), BOOT)
    assert len(text.encode()) < USER_DATA_LIMIT
    assert "{{" not in text and "{%" not in text and "${Token[" not in text
    script = tmp_path / "boot.sh"
    script.write_text(text)
    shellcheck = Path(sys.executable).parent / "shellcheck"
    out = subprocess.run([str(shellcheck), "-s", "bash", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.parametrize("name", sorted(PROFILES))
def test_profile_is_written_once_and_mtp_only_on_gpu(name):
    profile = PROFILES[name]
    text = render_user_data(InstanceSpec.of(profile), BOOT)
    (encoded,) = re.findall(r"echo ([A-Za-z0-9+/=]+) \| base64 -d", text)
    written = json.loads(base64.b64decode(encoded))
    assert written == json.loads(profile.runtime_json())
    assert (written["server"]["speculative"] is not None) == profile.hardware.has_gpu
    assert ("--gpus all" in text) == profile.hardware.has_gpu
    assert ("dnf install -y -q docker" in text) != profile.hardware.has_gpu  # the GPU AMI ships Docker


def test_api_key_is_read_at_start_never_embedded():
    text = render_user_data(InstanceSpec.of(PROFILES["graviton-moe"]), BOOT)
    assert "ExecStartPre=/usr/local/bin/gguf-serve-api-key" in text
    assert "--env-file /run/gguf-serve/api.env" in text
    assert "Restart=always" in text  # llama-server exits 0 on SIGTERM: on-failure would leave it down
    assert f"RestartPreventExitStatus={EX_CONFIG}" in text  # the launcher's refusal: retrying won't fix it


def test_the_latency_hop_takes_the_server_port_and_llama_server_only_loopback():
    """The ALB, the readiness check and the metrics publisher reach the hop; nothing but the hop reaches llama."""
    from gguf_serve.container import names

    text = render_user_data(InstanceSpec.of(PROFILES["graviton-moe"]), BOOT)
    port = PROFILES["graviton-moe"].server.port
    assert f"-p 127.0.0.1:{names.UPSTREAM_PORT}:{port} " in text and f"-p {port}:{port}" not in text
    hop = text[text.index(f"/etc/systemd/system/{names.HOP_UNIT}.service") :]
    hop = hop[: hop.index("\nUNIT\n")]
    assert "--network host" in hop and "-m gguf_serve.container.hop" in hop and "Restart=always" in hop
    assert f"--listen 0.0.0.0:{port} --upstream http://127.0.0.1:{names.UPSTREAM_PORT}" in hop
    # admission control reads slots and queue_per_slot from the runtime spec, mounted read-only
    assert f"--spec {names.RUNTIME_SPEC_PATH}" in hop and f"-v {names.CONFIG_DIR}:{names.CONFIG_DIR}:ro" in hop
    assert "--env-file" not in hop  # the key file is mounted read-only: the hop follows a rotated key
    assert f"-v {names.API_KEY_ENV_FILE}:{names.API_KEY_ENV_FILE}:ro" in hop and "--api-key-env-file" in hop
    assert f"systemctl enable --now {names.SERVER_UNIT}.service {names.HOP_UNIT}.service" in text
    assert f"http://127.0.0.1:{port}/health" in text and f"--url http://127.0.0.1:{port} " in text


def test_missing_value_is_an_error_not_an_empty_string():
    with pytest.raises(jinja2.UndefinedError):
        _ENV.get_template("boot.sh.j2").render(p=PROFILES["graviton-moe"])


def test_oversized_user_data_is_refused(monkeypatch):
    big = replace(BOOT, log_group="x" * USER_DATA_LIMIT)
    with pytest.raises(ValueError, match="EC2 allows"):
        render_user_data(InstanceSpec.of(PROFILES["graviton-moe"]), big)


def test_containers_that_call_aws_know_their_region():
    text = render_user_data(InstanceSpec.of(PROFILES["intel-moe"]), BOOT)
    assert '-e AWS_REGION="$REGION"' in text  # boto3 in the fetch container does not guess it
    assert "--region $REGION" in text  # the metrics publisher


def test_a_first_boot_cut_short_never_leaves_a_half_ready_instance_in_service():
    """A warm-pool instance stopped mid-user-data (no launch hook yet) does not rerun user data on its next start
    (cloud-init runs it once). What it does then depends only on which units were enabled: none before the model
    is verified on disk, and the ready unit (the only thing that completes the launch hook) last. So a cut boot
    either starts nothing, or a server that nobody reports: the launch hook times out with ABANDON and the group
    replaces the instance; it never reaches InService half set up."""
    text = render_user_data(InstanceSpec.of(PROFILES["graviton-moe"]), BOOT)
    at = {what: text.index(what) for what in (
        "run_container fetch", "systemctl enable --now gguf-serve-llama.service gguf-serve-hop.service",
        "systemctl enable --now gguf-serve-metrics.service", "systemctl enable gguf-serve-ready.service",
    )}  # fmt: skip
    assert list(at) == sorted(at, key=at.get)
    # only the ready unit completes the launch hook (and, for an upgrade's update, the hook's earlier name)
    script = f"/usr/local/bin/{names.READY_UNIT}"
    ready = text[text.index(f"cat > {script}") : text.index(f"chmod 0755 {script}")]
    assert text.count("--lifecycle-action-result CONTINUE") == ready.count("--lifecycle-action-result CONTINUE") == 2
    assert f"LAUNCH_HOOK={names.LIFECYCLE_HOOK}\n" in text and "LAUNCH_HOOK=${LAUNCH_HOOK@Q}\n" in ready
    for hook in ("\\$LAUNCH_HOOK", names.LEGACY_LIFECYCLE_HOOK):
        assert f'--lifecycle-hook-name "{hook}" --instance-id "\\$instance" --lifecycle-action-result CONTINUE' in ready


def test_behind_a_shared_endpoint_the_hop_is_started_with_a_route_per_other_model(tmp_path):
    """The hop command the unit writes, read by the hop's own parser: each other fleet's model goes to the shared
    load balancer's route listener; its own names are served here. Without a shared endpoint: no route at all."""
    import shlex

    from gguf_serve.container.hop.cli import _models, build_parser

    profile = PROFILES["graviton-moe"]
    routed = ("Qwen3.6-27B", "qwen3.6-27b")
    route_url = "http://internal-shared-123.cn-northwest-1.elb.amazonaws.com.cn:8000"
    boot = replace(BOOT, route_url=route_url)
    text = render_user_data(InstanceSpec.of(profile, routed), boot)
    hop = text[text.index(f"/etc/systemd/system/{names.HOP_UNIT}.service") :]
    command = hop[hop.index("ExecStart=") : hop.index("\nExecStop=")].replace("\\\n", " ")
    argv = shlex.split(command.replace("$ROUTE_URL", route_url))
    args = build_parser().parse_args(argv[argv.index("gguf_serve.container.hop") + 1 :])
    (spec := tmp_path / "runtime.json").write_text(profile.runtime_json())
    args.spec = str(spec)
    models = _models(args)
    assert models is not None and models.names == profile.runtime().model.served_names
    assert [(r.model, r.url) for r in models.routes] == [(name, route_url) for name in routed]
    assert f"ROUTE_URL={route_url}" in text  # set once, quoted (a plain URL needs no quotes)
    alone = render_user_data(InstanceSpec.of(profile), BOOT)
    assert re.search(r"--route \S+=", alone) is None and "ROUTE_URL" not in alone
    with pytest.raises(ProfileError, match="routed model"):
        InstanceSpec.of(profile, ("Qwen 27B; reboot",))
