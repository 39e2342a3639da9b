"""The API key in a pod: read from Secrets Manager once by an init container, handed to llama-server in its env.

The key never appears in a manifest, a ConfigMap or a Kubernetes Secret: the init container reads it with the pod's
own IAM role (IAM roles for service accounts) and writes it to a memory-backed emptyDir, readable by the pod's user
only, as the instance's env file (`LLAMA_API_KEY=<key>`, gguf_serve.container.names.API_KEY_ENV_FILE): the hop reads
it with --api-key-env-file exactly as on an instance, `serve` puts the key in llama-server's environment and execs
the launcher, and the scaler sends it to each pod's /metrics.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

from gguf_serve.container.names import API_KEY_ENV


class ApiKeyError(Exception):
    """The key cannot be had; the message says what to check."""


def write_api_key(secret_id: str, path: Path, *, region: str | None = None, client: object | None = None) -> None:
    """Fetch the secret's string and write it to `path` (mode 0600, whole or not at all)."""
    try:
        if client is None:
            import boto3

            # AWS_REGION (what EKS and the manifests set): botocore releases differ on reading it themselves
            region = region or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
            client = boto3.client("secretsmanager", region_name=region)
        key = client.get_secret_value(SecretId=secret_id)["SecretString"]  # type: ignore[attr-defined]
    except Exception as e:  # noqa: BLE001 - botocore's errors: one line that names the secret and the cause
        raise ApiKeyError(f"cannot read secret {secret_id}: {e}; check the service account's IAM role") from None
    if not key or any(c.isspace() for c in key):
        raise ApiKeyError(f"secret {secret_id} is empty or holds whitespace; an API key is one token")
    partial = path.with_name(path.name + ".part")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(f"{API_KEY_ENV}={key}\n")
    partial.replace(path)


def read_api_key(path: Path) -> str:
    """The key of an env file write_api_key wrote (its LLAMA_API_KEY line); ApiKeyError when there is none."""
    try:
        text = path.read_text()
    except OSError as e:
        raise ApiKeyError(f"cannot read the API key file {path}: {e.strerror}") from None
    for line in text.splitlines():
        name, sep, value = line.partition("=")
        if sep and name.strip() == API_KEY_ENV and value.strip():
            return value.strip()
    raise ApiKeyError(f"the API key file {path} has no {API_KEY_ENV}=... line")


def serve_with_key(key_file: Path, launch_args: list[str]) -> int:
    """The launcher's `serve` with the key from `key_file` in LLAMA_API_KEY (the launcher then execs llama-server)."""
    from gguf_serve.container.launch.cli import main as launch

    try:
        key = read_api_key(key_file)
    except ApiKeyError as e:
        print(f"gguf-serve-kube: {e}", file=sys.stderr, flush=True)
        return 1
    os.environ[API_KEY_ENV] = key
    return launch(["serve", *launch_args])
