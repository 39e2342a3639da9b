"""Reaching a llama-server: base URL, API key (flag, environment or Secrets Manager) and the OpenAI client."""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass
from typing import Any

from gguf_serve.catalog import Catalog, ServingProfile
from gguf_serve.catalog.local import local_profile
from gguf_serve.local.bench.method import REQUEST_TIMEOUT_S

API_KEY_ENV = "LLAMA_API_KEY"  # the variable llama-server itself reads
_KEY_FIELDS = ("api_key", "apiKey", "API_KEY", "key", "LLAMA_API_KEY")


def openai_base_url(endpoint: str) -> str:
    """llama-server serves the OpenAI API under /v1; accept the endpoint with or without it."""
    base = endpoint.rstrip("/")
    return base if base.endswith("/v1") else f"{base}/v1"


def secret_api_key(secret_id: str, *, region: str | None = None) -> str:
    """The API key from Secrets Manager: a plain string, or a JSON object with one of _KEY_FIELDS (or one value)."""
    import boto3

    region = region or secret_region(secret_id)
    value = boto3.client("secretsmanager", region_name=region).get_secret_value(SecretId=secret_id)["SecretString"]
    try:
        doc = json.loads(value)
    except json.JSONDecodeError:
        return value
    if isinstance(doc, dict):
        for name in _KEY_FIELDS:
            if name in doc:
                return str(doc[name])
        if len(doc) == 1:
            return str(next(iter(doc.values())))
        raise ValueError(f"secret {secret_id!r} is a JSON object without one of {_KEY_FIELDS}")
    return str(doc)


def secret_region(secret_id: str) -> str | None:
    """The region inside a secret ARN (the stack's ApiKeySecretArn output), so --region is rarely needed."""
    parts = secret_id.split(":")
    return parts[3] if len(parts) > 3 and parts[0] == "arn" and parts[3] else None


def resolve_api_key(*, api_key: str | None, secret_id: str | None, region: str | None) -> str:
    if api_key and secret_id:
        raise ValueError("give --api-key or --api-key-secret, not both")
    if secret_id:
        return secret_api_key(secret_id, region=region)
    return api_key or os.environ.get(API_KEY_ENV) or "no-key"  # the client insists on a value


def make_client(endpoint: str, api_key: str, *, timeout: float = REQUEST_TIMEOUT_S) -> Any:
    from openai import OpenAI

    # No retries: a retried request would count its failed attempt's time as generation time.
    return OpenAI(base_url=openai_base_url(endpoint), api_key=api_key, timeout=timeout, max_retries=0)


def served_model(client: Any, wanted: str | None = None) -> str:
    """The model id to request: the one the endpoint announces (llama-server answers with its --alias), or, where it
    lists several (a shared endpoint: gguf_serve/container/hop/models.py), the one named `wanted` (the profile's
    catalog model, any case; without one, the first)."""
    from openai import APIConnectionError, APIStatusError

    try:
        models = client.models.list().data
        ids = [m.id for m in models] if isinstance(models, list) else []
    except (APIConnectionError, APIStatusError):
        raise
    except Exception as e:  # noqa: BLE001 - HTML, a bare list, odd JSON: the client raises all sorts
        raise ValueError(
            f"the endpoint's /v1/models answer is not a model list ({type(e).__name__}); pass --model"
        ) from None
    if not ids or not all(isinstance(i, str) and i for i in ids):
        raise ValueError("the endpoint lists no model id at /v1/models; pass --model")
    if len(ids) == 1 or wanted is None:
        return ids[0]  # a hop lists its own model's names first
    chosen = [i for i in ids if i.lower() == wanted.lower()]
    if chosen:
        return chosen[0]
    raise ValueError(
        f"the endpoint serves several models, {', '.join(ids)}, not the profile's {wanted}; pass --model with one"
    )


@dataclass(frozen=True)
class Label:
    """What a results file says was measured."""

    profile: str
    instance_type: str
    hardware: str
    model: str | None  # None: use the served model id
    mtp: bool | None  # None: infer from the server's timings


def resolve_label(profile: str, catalog: Catalog) -> Label:
    """Label a run from the catalog: a profile name, or `local-<profile>` for the local runner's variant."""
    p: ServingProfile | None = catalog.profiles.get(profile)
    if p is None and profile.startswith("local-") and profile.removeprefix("local-") in catalog.profiles:
        p = local_profile(catalog, profile.removeprefix("local-"))
    if p is None:
        return Label(profile=profile, instance_type="unknown", hardware="unknown", model=None, mtp=None)
    from gguf_serve.local.bench.results import hardware_label

    hardware = hardware_label(p.hardware) if p.hardware.instance_type != "local" else _this_cpu(p.hardware.vcpus)
    return Label(
        profile=profile,
        instance_type=p.hardware.instance_type,
        hardware=hardware,
        model=p.model.name,
        mtp=p.mtp,
    )


def _this_cpu(vcpus: int) -> str:
    """A label for the machine running a local profile, e.g. "AMD EPYC, 2 vCPU"."""
    name = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            name = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{name}, {vcpus} vCPU"
