"""`gguf-serve-bench smoke`: the guide's two prompts against the real llama-server, and the comparison table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gguf_serve.local.bench import cli, smoke


def test_report_places_a_run_beside_the_guide_claim() -> None:
    results = [
        smoke.SmokeResult("quantum-computing", 128, 98.0, 90.0, 100, 82, "量子计算利用"),
        smoke.SmokeResult("quicksort", 256, 102.0, 99.0, 200, 158, "def quicksort"),
    ]
    text = smoke.report(results, label="RTX 4090 24GB")
    assert "| quantum-computing | 128 | 98.0 | 90.0 | 82.0% (82/100) |" in text
    assert "| guide's claim, Qwen3.6-27B MTP off -> on | 63.7 -> 105.4 | 80% |" in text
    assert "| RTX 4090 24GB | 100.0 | 80.0% |" in text  # mean decode speed, pooled acceptance 240/300


def test_bench_report_places_a_smoke_file_beside_the_guide_and_the_field_report(tmp_path: Path, capsys) -> None:
    results = [
        smoke.SmokeResult("quantum-computing", 128, 60.0, 55.0, None, None, "量子计算"),
        smoke.SmokeResult("quicksort", 256, 64.0, 60.0, None, None, "def quicksort"),
    ]
    path = tmp_path / "rtx3060.json"
    path.write_text(json.dumps(smoke.to_json(results, label="RTX 3060 12GB", endpoint_model="Qwen3.6-35B-A3B")))
    assert cli.main(["report", str(path)]) == 0
    text = capsys.readouterr().out
    assert "| guide's claim, Qwen3.6-27B MTP off -> on | 63.7 -> 105.4 | 80% |" in text
    assert "| RTX 3060 12GB (Qwen3.6-35B-A3B) | 62.0 | MTP off |" in text
    assert "c8g.4xlarge" in text  # the field report's tables are still there (the default figures)
    path.write_text(json.dumps({"schema": smoke.SCHEMA, "label": "x"}))
    assert cli.main(["report", str(path)]) == 2
    assert "not a valid smoke results file" in capsys.readouterr().err


def test_prompts_are_the_guides() -> None:
    guide = Path(__file__).resolve().parents[4] / "shared" / "seeds" / "003_a115da4e8474427c.txt"
    if not guide.exists():
        pytest.skip("the source document is not beside this checkout")
    text = guide.read_text()
    for _, prompt, max_tokens in smoke.PROMPTS:
        assert f'"{prompt}"' in text and f"max_new_tokens={max_tokens}" in text


@pytest.mark.e2e
def test_smoke_against_the_real_server(local_server, tmp_path: Path, capsys) -> None:
    url, key = local_server
    out = tmp_path / "smoke.json"
    assert cli.main(["smoke", "--endpoint", url, f"--api-key={key}", "--label", "ci", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| quantum-computing |" in printed and "| quicksort |" in printed and "MTP off" in printed
    doc = json.loads(out.read_text())
    assert [r["prompt"] for r in doc["results"]] == ["quantum-computing", "quicksort"]
    for r in doc["results"]:
        assert r["completion_tokens"] > 0 and r["decode_tok_s"] > 0 and r["acceptance"] is None
    print(printed)
    assert cli.main(["report", str(out)]) == 0  # the run beside the guide's claim
    assert "| ci (" in capsys.readouterr().out
