"""`gguf-serve-bench capacity` against a real llama-server (Gemma 3 270M, 4 slots): the curve, its knee, the roofline.

Numbers are not asserted (they are this machine's, recorded in docs/benchmark.md); what is asserted is what the
curve must be whatever the machine: every step's requests, the rates from their own tokens and clocks, the server's
slots, the bytes per token from the file's tensor table, the profile line the knee names.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

import pytest

from gguf_serve.local.bench import capacity, roofline
from gguf_serve.local.bench.cli import main
from gguf_serve.local.process import free_port, start_server
from tests.committed import CATALOG, GEMMA3_270M, local_profile

pytestmark = pytest.mark.e2e
SLOTS = 4


@pytest.fixture(scope="module")
def four_slots(llama_server_binary: Path, gemma_gguf: Path, tmp_path_factory: pytest.TempPathFactory):
    """llama-server with 4 slots through the launcher (`--benchmark`: prompt cache off, as the report ran it)."""
    server = start_server(
        local_profile(port=free_port()).with_server(parallel=SLOTS),
        gemma_gguf.parent,
        binary=llama_server_binary,
        api_key=secrets.token_urlsafe(24),
        workdir=tmp_path_factory.mktemp("llama-4"),
        benchmark=True,
    )
    try:
        server.wait_healthy(timeout=120, interval=0.05)
        yield server
    finally:
        server.stop()


def test_the_capacity_curve_of_a_real_server(
    four_slots, gemma_gguf: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out, chart, md = tmp_path / "cap.json", tmp_path / "cap.png", tmp_path / "cap.md"
    code = main(["capacity", "--endpoint", four_slots.url, "--api-key", four_slots.api_key, "--streams", "1,2,4",
                 "--max-tokens", "24", "--gguf", str(gemma_gguf), "--measure-bandwidth", "-o", str(out),
                 "--chart", str(chart), "--markdown", str(md)])  # fmt: skip
    captured = capsys.readouterr()
    assert code == 0, captured.err
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["server_slots"] == SLOTS  # llama-server's own /props
    assert [s["streams"] for s in doc["steps"]] == [1, 2, 4]
    mb = roofline.from_gguf(gemma_gguf, GEMMA3_270M, mtp=False)
    for step in doc["steps"]:
        s, runs = step["summary"], step["runs"]
        measured = [r for r in runs if not r["warmup"]]
        assert (s["requests"], s["errors"], len(measured)) == (step["streams"], 0, step["streams"])
        assert s["aggregate_tok_s"] == pytest.approx(sum(r["completion_tokens"] for r in measured) / step["wall_s"])
        assert s["per_stream_tok_s"] == pytest.approx(sum(r["effective_tok_s"] for r in measured) / len(measured))
        assert all(r["timings"]["cache_n"] == 0 and r["completion_tokens"] == r["timings"]["predicted_n"]
                   for r in measured)  # fmt: skip
        assert 0 < s["ttft_ms"]["p50"] <= s["ttft_ms"]["p95"] and s["itl_ms"]["p95"] > 0
        assert s["cny_per_million"] == pytest.approx(9069 / 12 / (s["aggregate_tok_s"] * 2.592))  # c8g.4xlarge RI
        rf = s["roofline"]
        depth = sum(r["prompt_tokens"] + r["completion_tokens"] / 2 for r in measured) / len(measured)
        assert rf["bytes_per_token"] == pytest.approx(mb.per_token(depth=depth, streams=step["streams"]))
        assert rf["implied_gb_s"] == pytest.approx(rf["bytes_per_token"] * s["aggregate_tok_s"] / 1e9)
        assert rf["efficiency"] == pytest.approx(rf["implied_gb_s"] / doc["bandwidth"]["gb_s"])
    assert "tensor table of gemma-3-270m-q4_k_m.gguf" in doc["model_bytes"]["basis"]
    knee = doc["knee"]
    assert knee["streams"] in (1, 2, 4) and knee["limited_by"] in ("growth", "none")
    assert "[2 streams] aggregate" in captured.err and "bandwidth:" in captured.err  # progress as it ran
    line = next(x for x in captured.out.splitlines() if x.startswith("write into "))
    where = line.removeprefix("write into ").split(":")
    text = (CATALOG.root.parent / where[0]).read_text().splitlines()[int(where[1].split()[0]) - 1]
    assert text.split("#")[0].strip() == "parallel = 2" and f"parallel = {knee['streams']}" in line
    assert capacity.table(doc) in md.read_text() and chart.stat().st_size > 5_000


def test_a_run_states_its_roofline(four_slots, gemma_gguf: Path, tmp_path: Path) -> None:
    """`run` reads the server's own decode rate against the bytes per token and a probe figure given for the host."""
    out = tmp_path / "run.json"
    code = main(["run", "--endpoint", four_slots.url, "--api-key", four_slots.api_key, "--max-tokens", "16",
                 "--repetitions", "1", "--warmup", "0", "--gguf", str(gemma_gguf), "--bandwidth-gbs", "50",
                 "-o", str(out)])  # fmt: skip
    assert code == 0
    doc = json.loads(out.read_text())
    [row] = doc["runs"]
    mb = roofline.from_gguf(gemma_gguf, GEMMA3_270M, mtp=False)
    rf = doc["roofline"]
    assert rf["tok_s"] == pytest.approx(doc["summary"]["predicted_per_second"])
    assert rf["bytes_per_token"] == pytest.approx(
        mb.per_token(depth=row["prompt_tokens"] + row["completion_tokens"] / 2)
    )
    assert rf["efficiency"] == pytest.approx(rf["implied_gb_s"] / 50)
