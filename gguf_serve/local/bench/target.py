"""What a measuring command (run, capacity) reaches: the endpoint or SageMaker endpoint, its key, the profile."""

from __future__ import annotations

import argparse
from typing import Any

from gguf_serve.local.bench import method, runner
from gguf_serve.local.bench.endpoint import Label, make_client, resolve_api_key, resolve_label, served_model

DEFAULT_ENDPOINT = "http://127.0.0.1:8080"
DEFAULT_PROFILE = "local-graviton-moe"


def add_target(p: argparse.ArgumentParser) -> None:
    """The endpoint a measuring command reaches, its key, the profile it labels with, the per-request timeout."""
    p.add_argument(
        "--endpoint", default=DEFAULT_ENDPOINT, help=f"base URL, with or without /v1 (default {DEFAULT_ENDPOINT})"
    )
    key = p.add_mutually_exclusive_group()
    key.add_argument(
        "--api-key", help="API key (visible in the process list; prefer LLAMA_API_KEY or --api-key-secret)"
    )
    key.add_argument("--api-key-secret", metavar="SECRET_ID", help="read the API key from AWS Secrets Manager")
    p.add_argument(
        "--sagemaker-endpoint", metavar="NAME",
        help="benchmark a SageMaker endpoint (IAM credentials, response stream) instead of --endpoint",
    )  # fmt: skip
    p.add_argument(
        "--region", help="AWS region for --api-key-secret and --sagemaker-endpoint (default: the ARN's, else boto3's)"
    )
    p.add_argument(
        "--profile",
        default=DEFAULT_PROFILE,
        help=f"catalog profile this endpoint serves, for labelling (default {DEFAULT_PROFILE})",
    )
    p.add_argument(
        "--model",
        help="model id to request (default: the one the endpoint lists; at a shared endpoint, the profile's model)",
    )
    p.add_argument("--timeout", type=float, default=method.REQUEST_TIMEOUT_S, help="seconds per request")


def connect(a: argparse.Namespace, catalog: Any, log: runner.Log) -> tuple[Label, Any, str]:
    """The run's label, an OpenAI client for the endpoint (or the SageMaker endpoint) and the model it serves."""
    from openai import APIConnectionError

    label = resolve_label(a.profile, catalog)
    if label.model is None:
        log(f"note: profile {a.profile!r} is not in the catalog; labelling instance and hardware 'unknown'")
    if a.sagemaker_endpoint:
        from gguf_serve.local.bench.sagemaker import make_sagemaker_client, sagemaker_label

        label = sagemaker_label(label, catalog)
        a.endpoint = f"sagemaker:{a.sagemaker_endpoint}"
        client = make_sagemaker_client(a.sagemaker_endpoint, region=a.region, timeout=a.timeout)
    else:
        key = resolve_api_key(api_key=a.api_key, secret_id=a.api_key_secret, region=a.region)
        client = make_client(a.endpoint, key, timeout=a.timeout)
    try:
        served = a.model or served_model(client, label.model)
    except APIConnectionError as exc:
        raise OSError(f"cannot reach {a.endpoint}: {exc}") from exc
    return label, client, served
