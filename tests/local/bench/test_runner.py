"""Summaries, percentiles and key resolution, without a server."""

from __future__ import annotations

import json

import pytest

from gguf_serve.local.bench import endpoint, runner
from tests.committed import CATALOG


def row(wall: float, tokens: int, prompt_ms: float, predicted_ms: float, **timings: int) -> dict:
    """A request as llama-server reports it: its generation rate leaves out the first token."""
    t = {
        "prompt_n": 50,
        "prompt_ms": prompt_ms,
        "predicted_n": tokens,
        "predicted_ms": predicted_ms,
        "predicted_per_second": (tokens - 1) / predicted_ms * 1000,
        **timings,
    }
    return {"warmup": False, **runner._timing_fields(wall, tokens, t)}


def test_sequential_summary_pools_tokens_and_time_and_skips_warmup() -> None:
    rows = [
        {**row(9.0, 10, 100, 8000), "warmup": True},
        row(2.0, 100, 100, 1880),
        row(4.0, 300, 100, 3880),
    ]
    s = runner.summarize_sequential(rows)
    assert s["runs"] == 2
    assert s["total_time_s"] == pytest.approx(3.0)
    assert s["effective_tok_s"] == pytest.approx(400 / 6.0)
    assert s["predicted_per_second"] == pytest.approx(398 / 5.76)
    assert s["harness_overhead_ms"] == pytest.approx(20.0)
    assert s["harness_generation_tok_s"] == pytest.approx(398 / 5.8)
    assert s["server_effective_tok_s"] == pytest.approx(400 / 5.96)


def test_draft_acceptance_is_accepted_over_drafted_across_runs() -> None:
    rows = [
        row(1.0, 50, 10, 900, draft_n=40, draft_n_accepted=30),
        row(1.0, 50, 10, 900, draft_n=60, draft_n_accepted=50),
    ]
    s = runner.summarize_sequential(rows)
    assert s["speculative"] is True
    assert (s["draft_n"], s["draft_n_accepted"], s["draft_acceptance"]) == (100, 80, 0.8)
    assert rows[0]["draft_acceptance"] == 0.75


def test_percentile_interpolates_like_numpy() -> None:
    values = [1.0, 2.0, 3.0, 4.0, 10.0]
    assert runner.percentile(values, 50) == 3.0
    assert runner.percentile(values, 95) == pytest.approx(8.8)
    assert runner.percentile(values, 99) == pytest.approx(9.76)
    assert runner.percentile([7.0], 99) == 7.0


def test_concurrency_summary_counts_failures_apart() -> None:
    ok = {**row(2.0, 100, 50, 1900), "ttft_s": 0.1, "itl_s": 0.019}
    rows = [ok, dict(ok), {"warmup": False, "error": "APITimeoutError"}]
    s = runner.summarize_concurrent(rows, wall=2.5, concurrency=3)
    assert (s["requests"], s["errors"], s["completion_tokens"]) == (2, 1, 200)
    assert s["aggregate_tok_s"] == pytest.approx(80.0)
    assert s["ttft_ms"]["p99"] == pytest.approx(100.0)


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://alb.internal", "http://alb.internal/v1"),
        ("http://alb.internal/", "http://alb.internal/v1"),
        ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080/v1"),
    ],
)
def test_openai_base_url(given: str, expected: str) -> None:
    assert endpoint.openai_base_url(given) == expected


@pytest.mark.parametrize(
    "secret",
    [
        "plain-key",
        json.dumps({"api_key": "plain-key"}),
        json.dumps({"LLAMA_API_KEY": "plain-key"}),
        json.dumps({"whatever": "plain-key"}),
    ],
)
def test_secrets_manager_key_formats(secret: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    with mock_aws():
        boto3.client("secretsmanager", region_name="cn-northwest-1").create_secret(Name="k", SecretString=secret)
        assert endpoint.secret_api_key("k", region="cn-northwest-1") == "plain-key"


def test_key_precedence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LLAMA_API_KEY", "from-env")
    assert endpoint.resolve_api_key(api_key=None, secret_id=None, region=None) == "from-env"
    assert endpoint.resolve_api_key(api_key="flag", secret_id=None, region=None) == "flag"
    with pytest.raises(ValueError, match="not both"):
        endpoint.resolve_api_key(api_key="flag", secret_id="s", region=None)


def test_labels_come_from_the_catalog() -> None:
    assert endpoint.resolve_label("graviton-moe", CATALOG) == endpoint.Label(
        profile="graviton-moe",
        instance_type="c8g.4xlarge",
        hardware="AWS Graviton4 (Neoverse V2)",
        model="Qwen3.6-35B-A3B",
        mtp=False,
    )
    assert endpoint.resolve_label("gpu-mtp", CATALOG).mtp is True
    assert endpoint.resolve_label("local-intel-moe", CATALOG).instance_type == "local"
    assert endpoint.resolve_label("my-own", CATALOG).model is None


def test_the_region_comes_from_a_secret_arn() -> None:
    arn = "arn:aws-cn:secretsmanager:cn-northwest-1:123456789012:secret:ApiKey-AbCdEf"
    assert endpoint.secret_region(arn) == "cn-northwest-1"
    assert endpoint.secret_region("qwen36/api-key") is None


def test_a_secret_arn_needs_no_region_flag(monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto import mock_aws

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_REGION", raising=False)
    with mock_aws():
        arn = boto3.client("secretsmanager", region_name="cn-northwest-1").create_secret(
            Name="ApiKey", SecretString="plain-key"
        )["ARN"]
        assert endpoint.secret_api_key(arn) == "plain-key"


def test_an_unreachable_endpoint_is_named_in_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    from gguf_serve.local.bench.cli import main

    assert main(["run", "--endpoint", "http://127.0.0.1:9", "--api-key", "k"]) == 2
    assert "cannot reach http://127.0.0.1:9" in capsys.readouterr().err
