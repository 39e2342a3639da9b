"""The capacity curve without llama-server: steps, the knee, what it says to write, and a run cut by Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gguf_serve.local.bench import capacity, cost, roofline
from tests.committed import CATALOG, PROFILES
from tests.local.bench.hostile_server import HostileServer

ROOT = Path(__file__).resolve().parents[3]


def step(streams: int, aggregate: float, *, ttft_p95_ms: float = 100.0, errors: int = 0) -> dict:
    summary = {"aggregate_tok_s": aggregate, "errors": errors, "ttft_ms": {"p50": 1.0, "p95": ttft_p95_ms}}
    return {"streams": streams, "runs": [], "summary": summary}


def test_doubling_ends_at_the_maximum_and_lists_must_rise() -> None:
    assert capacity.doubling(8) == [1, 2, 4, 8]
    assert capacity.doubling(6) == [1, 2, 4, 6]
    assert capacity.doubling(1) == [1]
    assert capacity.parse_streams("1, 2,3,6") == [1, 2, 3, 6]
    for bad in ("2,1", "0,1", "1,1", "a", ""):
        with pytest.raises(ValueError, match="--streams"):
            capacity.parse_streams(bad)


def test_the_knee_is_the_fewest_streams_past_which_no_step_adds_the_growth() -> None:
    steps = [step(1, 40.0), step(2, 70.0), step(4, 75.0), step(8, 76.0)]
    knee = capacity.find_knee(steps, min_growth=0.10, ttft_limit_s=30)
    assert (knee.streams, knee.limited_by) == (2, "growth")
    assert "70.00 tok/s at 2 streams; more streams reach at most 76.00 (+8.6% at 8), under the 10%" in knee.reason
    assert capacity.find_knee(steps, min_growth=0.05, ttft_limit_s=30).streams == 4  # 75 is within 5% of 76


def test_a_step_a_neighbour_slowed_does_not_end_the_curve() -> None:
    steps = [step(1, 40.0), step(2, 20.0), step(4, 80.0), step(8, 81.0)]
    assert capacity.find_knee(steps, min_growth=0.10, ttft_limit_s=30).streams == 4


def test_the_knee_stops_where_ttft_passes_the_limit_or_requests_fail() -> None:
    slow = [step(1, 40.0), step(2, 80.0), step(4, 160.0, ttft_p95_ms=31_000)]
    knee = capacity.find_knee(slow, min_growth=0.1, ttft_limit_s=30)
    assert (knee.streams, knee.limited_by) == (2, "ttft") and "P95 TTFT 31.0 s at 4 streams" in knee.reason
    failing = [step(1, 40.0), step(2, 80.0, errors=3)]
    assert capacity.find_knee(failing, min_growth=0.1, ttft_limit_s=30).limited_by == "failures"
    first = capacity.find_knee([step(1, 40.0, ttft_p95_ms=40_000)], min_growth=0.1, ttft_limit_s=30)
    assert first.streams is None
    growing = capacity.find_knee([step(1, 40.0), step(2, 80.0)], min_growth=0.1, ttft_limit_s=30)
    assert (growing.streams, growing.limited_by) == (2, "none") and "--max-streams 4" in growing.reason


def test_the_ttft_limit_is_the_stacks_alarm() -> None:
    from stacks.monitoring import TTFT_P95_ALARM_S

    assert capacity.TTFT_P95_LIMIT_S == TTFT_P95_ALARM_S


def test_the_recommendation_names_the_profile_line_that_holds_parallel() -> None:
    knee = capacity.Knee(4, "because", "growth")
    for name, profile in PROFILES.items():
        lines = capacity.recommendation(knee, profile, CATALOG, measured_on=profile.hardware.instance_type)
        where = lines[0].split("write into ")[1].split(":")
        path, number = ROOT / where[0], int(where[1].split()[0])
        assert path == CATALOG.root / "serving" / f"{name}.toml"
        assert (
            path.read_text().splitlines()[number - 1].split("#")[0].strip() == f"parallel = {profile.server.parallel}"
        )
        assert f"parallel = 4   (now {profile.server.parallel})" in lines[0]
        ratio = profile.fleet.scaling.target_busy_slot_ratio
        assert any(f"holds {ratio * 4:.2f} busy slots" in line for line in lines)
    mtp = capacity.recommendation(knee, PROFILES["gpu-mtp"], CATALOG, measured_on="g5.xlarge")
    assert "keeps parallel = 1" in mtp[1]
    local = capacity.recommendation(knee, PROFILES["graviton-moe"], CATALOG, measured_on="local")
    assert "measured on local, not c8g.4xlarge" in local[-1]


def test_a_step_is_priced_at_its_aggregate_and_read_against_the_roofline() -> None:
    rows = [
        {"client": c, "warmup": False, "wall_s": 2.0, "completion_tokens": 100, "prompt_tokens": 20,
         "effective_tok_s": 50.0, "ttft_s": 0.1, "itl_s": 0.02, "timings": {"predicted_n": 100}}
        for c in range(2)
    ]  # fmt: skip
    rows.append({"client": 2, "warmup": False, "error": "RateLimitError: 429", "status": 429})
    price = capacity.price_for("c8g.4xlarge", CATALOG)
    mb = roofline.from_lock(CATALOG.models["Qwen3.6-35B-A3B"], CATALOG.locks["Qwen3.6-35B-A3B"], mtp=False)
    s = capacity.step_summary(rows, 2.5, 3, price=price, model_bytes=mb, peak_gb_s=200.0)
    assert (s["requests"], s["errors"], s["rate_limited"]) == (2, 1, 1)
    assert s["aggregate_tok_s"] == 80.0 and s["per_stream_tok_s"] == 50.0
    assert s["cny_per_million"] == pytest.approx(9069 / 12 / (80.0 * 30 * 86400 / 1e6))
    assert price.monthly_cny == cost.ri_cost("c8g.4xlarge", 1.0, hardware=CATALOG.hardware).monthly_cny
    r = s["roofline"]
    assert r["depth"] == 70.0 and r["streams"] == 3
    assert r["implied_gb_s"] == pytest.approx(mb.per_token(depth=70.0, streams=3) * 80.0 / 1e9)
    assert r["efficiency"] == pytest.approx(r["implied_gb_s"] / 200.0)


def test_a_type_without_a_price_has_no_yuan_column() -> None:
    assert capacity.price_for("local", CATALOG) is None
    assert capacity.price_for("m8g.4xlarge", CATALOG) is None  # a Spot alternative: no price in the catalog
    g5 = capacity.price_for("g5.xlarge", CATALOG)
    assert g5 is not None and g5.pricing == "ri-1yr-all-upfront"


def capacity_cmd(url: str, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "gguf_serve.local.bench", "capacity", "--endpoint", url, "--max-tokens", "8",
            "--warmup", "0", "-o", str(out), *extra]  # fmt: skip


ENV = {**os.environ, "PYTHONPATH": str(ROOT), "LLAMA_API_KEY": "k"}


def test_429s_are_counted_and_end_the_curve(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    with HostileServer(["ok", "ok", "429"]) as server:
        p = subprocess.run(capacity_cmd(server.url, out, "--max-streams", "4", "--chart", str(tmp_path / "c.png")),
                           cwd=ROOT, env=ENV, capture_output=True, text=True, timeout=120)  # fmt: skip
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and [s["streams"] for s in doc["steps"]] == [1, 2, 4]
    assert doc["steps"][1]["summary"]["rate_limited"] == 1 and doc["steps"][2]["summary"] is None
    assert doc["knee"]["streams"] == 1 and doc["knee"]["limited_by"] == "failures"
    assert "| 4 | 0 | 4 | 4 |" in p.stdout  # every request of the last step shed with 429
    assert "knee: 1 stream: 1 requests failed at 2 streams" in p.stdout
    assert (tmp_path / "c.png").stat().st_size > 5_000


# Ctrl-C as a terminal delivers it: SIGINT at its default in the child, so Python raises KeyboardInterrupt. A test
# run started in the background by a shell without job control (`.ci/run &`, nohup) inherits SIGINT ignored, and
# Python keeps an ignored SIGINT ignored: the run then went on to its end (CI failed on it once, 9.8 s).
AT_A_TERMINAL = [sys.executable, "-c", "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
                 "os.execv(sys.argv[1], sys.argv[1:])"]  # fmt: skip


def test_ctrl_c_keeps_the_finished_steps_and_the_rerun_measures_the_rest(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    # 1 stream: a quick answer; 2 streams: answers that take 10 s, cut by Ctrl-C; the rerun's are quick again.
    with HostileServer(["ok", "slow-stream", "slow-stream", "ok"]) as server:
        proc = subprocess.Popen([*AT_A_TERMINAL, *capacity_cmd(server.url, out, "--streams", "1,2")], cwd=ROOT,
                                env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        deadline = time.monotonic() + 60
        while len(server.served) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.5)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=30)
        assert time.monotonic() - started < 5, "Ctrl-C waited for the open streams"
        assert proc.returncode == 130 and "Traceback" not in stderr, stderr
        assert "1 finished steps kept" in stderr and "(unfinished: 1 of 2 steps)" in stdout
        doc = json.loads(out.read_text())
        assert doc["complete"] is False and doc["current"] is None
        assert [s["streams"] for s in doc["steps"]] == [1] and doc["steps"][0]["summary"]["requests"] == 1
        again = subprocess.run(capacity_cmd(server.url, out, "--streams", "1,2"), cwd=ROOT, env=ENV,
                               capture_output=True, text=True, timeout=120)  # fmt: skip
    assert again.returncode == 0, again.stderr
    assert "1 steps kept from" in again.stderr and len(server.served) == 5  # only the 2-stream step again
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and [s["streams"] for s in doc["steps"]] == [1, 2]


def test_a_results_file_renders_again_without_measuring(tmp_path: Path) -> None:
    out = tmp_path / "cap.json"
    with HostileServer(["ok"]) as server:
        subprocess.run(capacity_cmd(server.url, out, "--streams", "1,2"), cwd=ROOT, env=ENV, capture_output=True,
                       timeout=120, check=True)  # fmt: skip
        served = len(server.served)
        p = subprocess.run([sys.executable, "-m", "gguf_serve.local.bench", "capacity", "--from", str(out),
                            "--markdown", str(tmp_path / "c.md")], cwd=ROOT, env=ENV, capture_output=True,
                           text=True, timeout=60)  # fmt: skip
        assert len(server.served) == served
    assert p.returncode == 0 and (tmp_path / "c.md").read_text() == p.stdout
    assert capacity.table(json.loads(out.read_text())) in p.stdout
