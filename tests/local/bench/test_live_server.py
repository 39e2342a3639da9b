"""The benchmark against a real llama-server (Gemma 3 270M on loopback): results, concurrency, harness overhead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_serve.local.bench import method, results, tables
from gguf_serve.local.bench.cli import main
from tests.committed import CATALOG

pytestmark = pytest.mark.e2e


def bench_run(tmp_path: Path, name: str, url: str, *extra: str) -> dict:
    out = tmp_path / f"{name}.json"
    assert main(["run", "--endpoint", url, "--output", str(out), *extra]) == 0
    return json.loads(out.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def sequential(local_server, tmp_path_factory: pytest.TempPathFactory) -> Path:
    url, key = local_server
    tmp = tmp_path_factory.mktemp("bench")
    bench_run(tmp, "sequential", url, f"--api-key={key}", "--max-tokens", "32", "--repetitions", "2", "--warmup", "1")
    return tmp / "sequential.json"


def test_run_writes_the_reports_method_and_the_servers_timings(sequential: Path) -> None:
    doc = json.loads(sequential.read_text(encoding="utf-8"))
    assert doc["schema"] == results.SCHEMA and doc["kind"] == "sequential"
    assert (doc["profile"], doc["instance_type"], doc["model"], doc["served_model"]) == (
        "local-graviton-moe",
        "local",
        "Gemma-3-270M",
        "Gemma-3-270M",
    )
    assert doc["endpoint"].startswith("http://127.0.0.1:") and doc["started_at"] <= doc["finished_at"]
    assert doc["method"]["prompt"] == method.PROMPT
    assert doc["method"] | {"max_tokens": 32} == doc["method"]
    assert (doc["method"]["thinking"], doc["method"]["cache_prompt"]) == (True, False)
    assert [r["warmup"] for r in doc["runs"]] == [True, False, False]
    for run in doc["runs"]:
        t = run["timings"]
        assert t["cache_n"] == 0  # the prompt cache was off for every request, even the repeated prompt
        assert run["completion_tokens"] == t["predicted_n"] <= 32
        assert t["prompt_per_second"] > 0 and t["predicted_per_second"] > 0
        # llama-server's generation rate leaves out the first token (prompt processing produces it)
        assert t["predicted_per_second"] == pytest.approx((t["predicted_n"] - 1) / t["predicted_ms"] * 1000)
        assert run["effective_tok_s"] == pytest.approx(run["completion_tokens"] / run["wall_s"])
    s = doc["summary"]
    assert s["runs"] == 2 and s["speculative"] is False and s["draft_acceptance"] is None
    assert s["draft_n"] == 0 and doc["mtp"] is False
    assert 0 < s["effective_tok_s"] < s["predicted_per_second"]


def test_report_renders_a_live_result(sequential: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(sequential), "--charts", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    row = [c.strip() for c in out.split("## 5.1 Full data")[1].splitlines()[4].strip("|").split("|")]
    assert row[0] == "local" and row[2] == "Gemma-3-270M (Dense)" and row[3] == "OFF"
    assert "No configuration was measured both with and without MTP" in out
    assert "No measured instance has a price in the catalog" in out
    assert (tmp_path / "throughput.png").stat().st_size > 5_000


def test_harness_overhead_is_within_2_percent_of_the_servers_timings(local_server, tmp_path: Path) -> None:
    """The harness's clock around each request against llama-server's own `timings` for that request.

    Wall time = prompt_ms + predicted_ms + overhead (HTTP, JSON, client). Effective tok/s counts the prompt, so
    compare like with like: the harness's generation rate, predicted_n / (wall - prompt_ms), against the server's
    predicted_per_second (predicted_n / predicted_ms); and effective tok/s against predicted_n / (prompt_ms +
    predicted_ms). Both differ only by the harness's overhead.
    """
    url, key = local_server
    doc = bench_run(
        tmp_path, "overhead", url, f"--api-key={key}", "--max-tokens", "96", "--repetitions", "3", "--warmup", "0"
    )
    s = doc["summary"]
    assert s["harness_generation_tok_s"] / s["predicted_per_second"] == pytest.approx(1, abs=0.02)
    assert s["effective_tok_s"] / s["server_effective_tok_s"] == pytest.approx(1, abs=0.02)
    assert 0 <= s["harness_overhead_pct"] < 2
    for run in doc["runs"]:
        assert run["overhead_ms"] >= 0  # the client cannot see a response before the server has made it


def test_concurrency_mode_reports_ttft_itl_and_percentiles(
    local_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    url, key = local_server
    monkeypatch.setenv("LLAMA_API_KEY", key)
    doc = bench_run(
        tmp_path, "conc", url, "--concurrency", "3", "--repetitions", "2", "--warmup", "1", "--max-tokens", "16"
    )
    progress = capsys.readouterr().err
    assert progress.count("[client ") == 6 and "[warmup 1/1]" in progress
    s = doc["summary"]
    assert doc["kind"] == "concurrency" and doc["method"]["stream"] is True
    assert (s["concurrency"], s["requests"], s["errors"]) == (3, 6, 0)
    assert s["aggregate_tok_s"] == pytest.approx(s["completion_tokens"] / s["wall_s"])
    for key_ in ("ttft_ms", "itl_ms", "latency_s", "per_request_tok_s"):
        p = s[key_]
        assert 0 < p["p50"] <= p["p95"] <= p["p99"], key_
    assert s["ttft_ms"]["p99"] / 1000 <= s["latency_s"]["p99"]
    measured = [r for r in doc["runs"] if not r["warmup"]]
    assert {r["client"] for r in measured} == {0, 1, 2}
    assert all(r["ttft_s"] < r["wall_s"] and r["completion_tokens"] == r["timings"]["predicted_n"] for r in measured)
    assert main(["report", str(tmp_path / "conc.json"), "--charts", str(tmp_path / "img")]) == 0
    assert "| local-graviton-moe | Gemma-3-270M | 3 | 6 | 0 |" in capsys.readouterr().out
    assert (tmp_path / "img" / "concurrency.png").is_file()


def test_a_wrong_api_key_fails_cleanly(local_server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url, _ = local_server
    code = main(["run", "--endpoint", url, "--api-key", "wrong", "--model", "x", "-o", str(tmp_path / "x.json")])
    assert code == 2
    assert "401" in capsys.readouterr().err
    assert not (tmp_path / "x.json").exists()


def test_api_key_from_secrets_manager(local_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import boto3
    from moto import mock_aws

    url, key = local_server
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("LLAMA_API_KEY", raising=False)
    with mock_aws():
        sm = boto3.client("secretsmanager", region_name="cn-northwest-1")
        sm.create_secret(Name="qwen36/api-key", SecretString=json.dumps({"api_key": key}))
        doc = bench_run(
            tmp_path,
            "secret",
            url,
            "--api-key-secret",
            "qwen36/api-key",
            "--region",
            "cn-northwest-1",
            "--max-tokens",
            "8",
            "--repetitions",
            "1",
            "--warmup",
            "0",
        )
    assert doc["summary"]["runs"] == 1
    assert key not in json.dumps(doc)  # the key never lands in a results file


def test_table_from_two_live_files_pairs_nothing_but_lists_both(sequential: Path) -> None:
    both = results.load([sequential, sequential], catalog=CATALOG)
    assert len(tables.full_data(both).splitlines()) == 4
