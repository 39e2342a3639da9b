"""No value reaches a shell unquoted: the boot script is run whole, as root, in a private mount namespace (an overlay on
every folder it writes) with stand-ins for the commands that reach AWS, Docker and systemd, and with values that
carry `$(...)`, backticks and quotes. Nothing they say runs, and each one arrives as one argument, unchanged, in the
boot script and in the scripts it writes for later (the API key and readiness scripts, run here too)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from dataclasses import fields
from pathlib import Path

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.container import names
from tests.committed import PROFILES
from tests.userdata.test_boot_script import BOOT
from userdata import BootSettings, InstanceSpec, render_user_data
from userdata.render import TEMPLATE, shell_quote

SOURCE = (Path(__file__).parents[2] / "userdata" / "templates" / TEMPLATE).read_text()
OVERLAID = ["/etc", "/usr/local", "/opt", "/var/log"]  # what the script writes lands in the test's folder
STUBBED = ["curl", "aws", "docker", "dnf", "systemctl", "logger", "journalctl", "sleep", "nvidia-smi"]
SEP = "\x1e"


def test_every_value_is_quoted_in_the_template() -> None:
    """Profile and stack values go through `sh` (shell) or `tojson` (the agent's JSON); the shared names are
    constants of safe characters."""
    for expr in re.findall(r"{{(.*?)}}", SOURCE):
        expr = expr.strip()
        if expr.startswith("n."):
            value = getattr(names, expr[2:])
            assert re.fullmatch(r"[A-Za-z0-9_./:-]+", str(value)), expr
        else:
            assert expr.endswith(("| sh", "| tojson")), f"unquoted in the boot template: {{{{ {expr} }}}}"


@pytest.mark.parametrize("bad", ["o/$(reboot)", "o/`reboot`", 'o/a"b', "o/a\nb", "o/a b", "o/-rf"])
def test_the_instance_spec_refuses_a_repo_a_shell_would_read(bad: str) -> None:
    base = InstanceSpec.of(PROFILES["intel-moe"])
    values = {f.name: getattr(base, f.name) for f in fields(InstanceSpec)}
    with pytest.raises(ProfileError, match="model_repo .* is not allowed"):
        InstanceSpec(**{**values, "model_repo": bad})


def test_a_control_character_is_refused_not_quoted() -> None:
    assert shell_quote("a b") == "'a b'" and shell_quote(8080) == "8080"
    with pytest.raises(ValueError, match="control character"):
        shell_quote("intel\nmoe")


def _stubs(folder: Path, log: Path) -> Path:
    folder.mkdir()
    answers = {  # what the stand-ins print: IMDS, the key, the release, /health
        "curl": 'case "$*" in *api/token*) echo token;; *instance-id*) echo i-0123;; *groupName*) echo group-1;;'
        " *health*) echo 200;; esac",
        "aws": 'case "$*" in *get-secret-value*) echo sekret;; *get-parameter*) echo "$RELEASE_SEEN";; esac',
        "systemctl": '[[ "$1" == is-failed ]] && exit 1; exit 0',
    }
    for name in STUBBED:
        record = f'{{ printf "%s\\0" "{name}" "$@"; printf "{SEP}"; }} >> {log}'
        script = f"#!/bin/bash\n{record}\n[[ -t 0 ]] || cat >/dev/null\n{answers.get(name, '')}\nexit 0\n"
        (folder / name).write_text(script)
        (folder / name).chmod(0o755)
    return folder


def _calls(log: Path) -> list[list[str]]:
    text = log.read_text() if log.exists() else ""
    return [entry.split("\0")[:-1] for entry in text.split(SEP) if entry]


def _hostile(marker: Path) -> tuple[InstanceSpec, BootSettings]:
    """Values that run `touch <marker>-N` if any shell ever reads them unquoted. The spec's are past its own
    check (built without __init__): quoting alone must hold."""
    base = InstanceSpec.of(PROFILES["intel-moe"])
    spec = object.__new__(InstanceSpec)
    for f in fields(InstanceSpec):
        object.__setattr__(spec, f.name, getattr(base, f.name))
    object.__setattr__(spec, "model_repo", f"o/$(touch {marker}-1)")
    object.__setattr__(spec, "model_file", f"a`touch {marker}-2`.gguf")
    evil = {
        "api_key_secret_arn": f"arn:x'\"$(touch {marker}-3)\"'",
        "model_cache_url": f"s3://b/`touch {marker}-4`",
        "lifecycle_hook": f'hook"; touch {marker}-5; "',
        "stack_name": f"Stack'$(touch {marker}-6)'",
        "release_parameter": f"/p/$(touch {marker}-7)",
        "log_group": f'/g"}}, "x": "$(touch {marker}-8)',
        "route_url": f"http://alb:8000/$(touch {marker}-9)",
    }
    object.__setattr__(spec, "routed_models", ("Qwen3.6-27B",))  # the route URL is written only where it is used
    boot = BootSettings(**{**{f.name: getattr(BOOT, f.name) for f in fields(BootSettings)}, **evil})
    return spec, boot


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root and unshare(1)")
def test_hostile_values_run_nothing_and_arrive_whole(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    spec, boot = _hostile(marker)
    script = tmp_path / "user-data.sh"
    script.write_text(render_user_data(spec, boot))
    log = tmp_path / "calls"
    stubs = _stubs(tmp_path / "bin", log)
    layers = []
    for i, folder in enumerate(OVERLAID):
        upper, work = tmp_path / f"upper{i}", tmp_path / f"work{i}"
        upper.mkdir(), work.mkdir()
        layers.append(f"mount -t overlay overlay -o lowerdir={folder},upperdir={upper},workdir={work} {folder}")
    mounts = " && ".join([*layers, "mount -t tmpfs none /run"])
    later = f"{names.API_KEY_SCRIPT} && /usr/local/bin/{names.READY_UNIT}"
    agent = "/opt/aws/amazon-cloudwatch-agent"
    ctl = f"{agent}/bin/amazon-cloudwatch-agent-ctl"
    inner = (f"{mounts} && mkdir -p {agent}/etc {agent}/bin && cp {stubs}/docker {ctl} && bash {script} && {later};"
             f" echo rc=$?; cat {agent}/etc/{names.PRODUCT}.json")  # fmt: skip
    env = {**os.environ, "PATH": f"{stubs}:{os.environ['PATH']}", "RELEASE_SEEN": boot.release}
    out = subprocess.run(["unshare", "-m", "bash", "-c", inner], capture_output=True, text=True, env=env, timeout=120)
    assert "rc=0" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]
    assert not list(tmp_path.glob("pwned-*")), "a value ran as a command"
    calls = _calls(log)

    def argv_with(flag: str, value: str) -> bool:
        return any(flag in c and c[c.index(flag) + 1] == value for c in calls)

    assert argv_with("--s3-cache", boot.model_cache_url)  # the fetch container, in the boot script
    assert argv_with("--secret-id", boot.api_key_secret_arn)  # the API key script, written then run
    assert argv_with("--lifecycle-hook-name", boot.lifecycle_hook)  # the readiness script
    assert argv_with("--stack-name", boot.stack_name) and argv_with("--name", boot.release_parameter)
    agent_config = json.loads(out.stdout[out.stdout.index("rc=0") + 4 :])
    assert agent_config["logs"]["logs_collected"]["files"]["collect_list"][0]["log_group_name"] == boot.log_group
    boot_log = tmp_path / f"upper{OVERLAID.index('/var/log')}" / Path(names.BOOT_LOG).name
    step = f"{names.BOOT_TAG}: model {spec.model_repo}/{spec.model_file} (S3 cache first, then ModelScope)"
    assert step in boot_log.read_text().splitlines()  # the boot log's line, the value as it is
