"""The pod's API key: read from Secrets Manager (moto) into a 0600 file, whole or not at all, then into llama-server's
environment by `serve`; every failure is one line."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import boto3
import pytest
from moto import mock_aws

from gguf_serve.container.hop.auth import ApiKeys
from gguf_serve.container.kube.apikey import ApiKeyError, read_api_key, write_api_key
from tests.conftest import ROOT


@pytest.fixture
def secrets():
    with mock_aws():
        yield boto3.client("secretsmanager", region_name="cn-northwest-1")


def test_the_key_is_written_for_the_pod_user_only(secrets, tmp_path):
    arn = secrets.create_secret(Name="k", SecretString="abc123")["ARN"]
    out = tmp_path / "api-key"
    write_api_key(arn, out, client=secrets)
    assert out.read_text() == "LLAMA_API_KEY=abc123\n"  # the instance's env file: the hop reads it the same way
    assert read_api_key(out) == "abc123" and ApiKeys(env_file=out).keys == (b"abc123",)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert not (tmp_path / "api-key.part").exists()


def test_a_missing_or_blank_secret_is_one_line_and_no_file(secrets, tmp_path):
    out = tmp_path / "api-key"
    with pytest.raises(ApiKeyError, match="cannot read secret nope"):
        write_api_key("nope", out, client=secrets)
    arn = secrets.create_secret(Name="blank", SecretString="two words")["ARN"]
    with pytest.raises(ApiKeyError, match="whitespace"):
        write_api_key(arn, out, client=secrets)
    assert not out.exists()


@pytest.mark.parametrize("content", [None, "", "abc123\n"])  # none, empty, a bare key (no LLAMA_API_KEY= line)
def test_serve_without_a_key_refuses_in_one_line(tmp_path, content):
    key = tmp_path / "api-key"
    if content is not None:
        key.write_text(content)
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.kube", "serve", "--key-file", str(key), "--", "--spec", "x"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 1 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "API key file" in out.stderr


def test_serve_hands_the_key_to_the_launcher(tmp_path):
    """With a key, the launcher runs (and here refuses the missing spec in its own one line: exit 78, EX_CONFIG)."""
    key = tmp_path / "api-key"
    key.write_text("LLAMA_API_KEY=k\n")
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.kube", "serve", "--key-file", str(key), "--",
         "--spec", str(tmp_path / "absent.json"), "--model-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 78 and "cannot read the runtime spec" in out.stderr, out.stderr


def test_a_region_nowhere_to_be_found_is_one_line_not_a_traceback(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.kube", "api-key", "--secret-id", "k", "--out",
         str(tmp_path / "k")],
        capture_output=True, text=True, timeout=60, env={**env, "PYTHONPATH": str(ROOT), "HOME": str(tmp_path)},
    )  # fmt: skip
    assert out.returncode == 1 and "Traceback" not in out.stderr, out.stderr
    assert "cannot read secret k" in out.stderr
