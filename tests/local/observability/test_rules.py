"""Recording and alert rules, checked and unit-tested by the real promtool; names match what is exported."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import yaml

from gguf_serve.container.hop import names

from .conftest import OBSERVABILITY

RULES = OBSERVABILITY / "rules"
LLAMA_SERVER_METRICS = {  # llama-server's own families the rules read (tests/container/metrics/data has the capture)
    "llamacpp:tokens_predicted_total",
    "llamacpp:spec_decode_num_accepted_tokens_total",
    "llamacpp:spec_decode_num_draft_tokens_total",
}


def _promtool(binaries: dict[str, Path], *args: str, cwd: Path = RULES) -> subprocess.CompletedProcess:
    return subprocess.run([str(binaries["promtool"]), *args], cwd=cwd, capture_output=True, text=True, timeout=120)


def test_rules_are_valid(prometheus_bin) -> None:
    out = _promtool(prometheus_bin, "check", "rules", "recording.yml", "alerts.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_pass(prometheus_bin) -> None:
    out = _promtool(prometheus_bin, "test", "rules", "tests.yml")
    assert out.returncode == 0, out.stdout + out.stderr


def test_rule_unit_tests_catch_a_changed_threshold(prometheus_bin, tmp_path: Path) -> None:
    """Negative control: the same tests against alerts whose TTFT threshold moved from 10 s to 20 s fail."""
    for f in RULES.iterdir():
        shutil.copy(f, tmp_path / f.name)
    alerts = tmp_path / "alerts.yml"
    text = alerts.read_text()
    assert "job:gguf_serve_time_to_first_token_seconds:p95_5m > 10" in text
    alerts.write_text(text.replace("p95_5m > 10", "p95_5m > 20"))
    out = _promtool(prometheus_bin, "test", "rules", "tests.yml", cwd=tmp_path)
    assert out.returncode != 0 and "GgufServeTtftP95High" in out.stdout + out.stderr


def test_every_percentile_and_gpu_series_has_a_rule() -> None:
    doc = yaml.safe_load((RULES / "recording.yml").read_text())
    records = {r["record"] for g in doc["groups"] for r in g["rules"]}
    for hist in (names.TTFT, names.ITL, names.QUEUE_WAIT, names.DECODE_TPS, names.DRAFT_ACCEPTANCE):
        for q in ("p50", "p95", "p99"):
            assert f"job:{hist}:{q}_5m" in records
    alerts = yaml.safe_load((RULES / "alerts.yml").read_text())
    exprs = " ".join(r["expr"] for g in alerts["groups"] for r in g["rules"])
    for needle in ("time_to_first_token", "inter_token", "queue_wait", "decode_tokens", "draft_acceptance",
                   "gpu_memory_used", "gpu_temperature"):  # fmt: skip
        assert needle in exprs


def test_rules_read_only_exported_names() -> None:
    """A renamed metric must not leave a rule silently empty: every series a rule reads is exported."""
    exported = set(names.HISTOGRAMS) | set(names.GPU_GAUGES) | {names.REQUESTS} | LLAMA_SERVER_METRICS | {"up"}
    text = (RULES / "recording.yml").read_text() + (RULES / "alerts.yml").read_text()
    recorded = set(re.findall(r"record: (\S+)", text))
    read = set(re.findall(r"(?<![:\w])(gguf_serve_[a-z_]+)(?![:\w])", text)) | set(
        re.findall(r'__name__="([^"]+)"', text)
    )
    read |= {"up"} if re.search(r"\bup\{", text) else set()
    for series in read:
        base = re.sub(r"_(bucket|sum|count)$", "", series)
        assert series in exported or base in exported or series in recorded, series
