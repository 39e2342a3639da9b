"""`gguf-serve-bench run` against an endpoint that misbehaves: bad answers are never measurements, finished
measurements are never lost, and odd answers or files end in one line, not a traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.local.bench.hostile_server import HostileServer

ROOT = Path(__file__).resolve().parents[3]


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.local.bench", *args], cwd=ROOT, capture_output=True, text=True, timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), "LLAMA_API_KEY": "k"},
    )  # fmt: skip


def run(url: str, out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return bench("run", "--endpoint", url, "--max-tokens", "8", "--warmup", "1", "-o", str(out), *extra)


def test_empty_html_and_unfinished_answers_are_not_measurements(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with HostileServer(["ok", "zero-tokens", "html", "no-finish"]) as server:
        p = run(server.url, out, "--repetitions", "3")
    assert p.returncode == 1 and "Traceback" not in p.stderr, p.stderr
    assert "0 valid of 3 measured requests" in p.stderr
    doc = json.loads(out.read_text())
    assert doc["complete"] is False and doc["summary"] is None
    errors = [r["error"] for r in doc["runs"] if not r["warmup"]]
    assert "0 completion tokens" in errors[0] and "not a chat completion" in errors[1]
    assert "finish_reason None" in errors[2]


def test_streams_cut_before_their_end_are_not_measurements(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with HostileServer(["ok", "cut-stream"]) as server:
        p = run(server.url, out, "--concurrency", "2", "--repetitions", "2")
    assert p.returncode == 1 and "0 valid of 4 measured requests" in p.stderr, p.stderr
    doc = json.loads(out.read_text())
    assert all("cut short" in r["error"] or "did not finish" in r["error"] for r in doc["runs"] if not r["warmup"])


@pytest.mark.parametrize(("script", "mode"), [("slow-stream", ("--concurrency", "1")), ("slow-body", ())])
def test_an_answer_past_its_deadline_is_cut_off(script: str, mode: tuple[str, ...], tmp_path: Path) -> None:
    """A token every 0.5 s, or a JSON byte every 0.05 s, never trips a 2 s read timeout; the request's deadline does."""
    out = tmp_path / "r.json"
    started = time.monotonic()
    with HostileServer([script]) as server:
        p = run(server.url, out, *mode, "--repetitions", "1", "--warmup", "0", "--timeout", "2")
    elapsed = time.monotonic() - started
    assert p.returncode == 1, p.stderr
    [row] = json.loads(out.read_text())["runs"]
    assert "after the 2 s request deadline" in row["error"] and server.url[7:] in row["error"]
    assert elapsed < 9, f"took {elapsed:.1f} s: the answer ran to its end"


def test_a_500_mid_run_keeps_what_finished_and_the_rerun_resumes(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    with HostileServer(["ok", "ok", "500", "ok"]) as server:
        first = run(server.url, out, "--repetitions", "3")
        assert first.returncode == 1 and "2 valid of 3" in first.stderr and "run the same command" in first.stderr
        kept = json.loads(out.read_text())
        assert kept["complete"] is False and sum(not r["warmup"] and "error" not in r for r in kept["runs"]) == 2
        assert len(server.served) == 4
        second = run(server.url, out, "--repetitions", "3")
    assert second.returncode == 0, second.stderr
    assert "2 kept from" in second.stderr and len(server.served) == 6  # one warm-up and the one missing run
    doc = json.loads(out.read_text())
    assert doc["complete"] is True and doc["summary"]["runs"] == 3
    assert bench("report", str(out)).returncode == 0


def test_an_unwritable_output_fails_before_any_request(tmp_path: Path) -> None:
    with HostileServer(["ok"]) as server:
        p = run(server.url, Path("/proc/1/results.json"), "--repetitions", "1")
        assert server.served == []
    assert p.returncode == 2 and "cannot write the results file" in p.stderr and "Traceback" not in p.stderr


@pytest.mark.parametrize("models", [b"[]", b"<html>oops</html>", b'{"data": [{}]}', b'{"data": "x"}'])
def test_an_odd_model_list_is_one_line(models: bytes, tmp_path: Path) -> None:
    with HostileServer(["ok"], models=models) as server:
        p = run(server.url, tmp_path / "r.json", "--repetitions", "1")
        assert server.served == []
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert "pass --model" in p.stderr.strip().splitlines()[-1]


@pytest.mark.parametrize("body", ["[]", '{"schema": "qwen36-bench/1", "kind": "sequential"}'])
def test_an_odd_results_file_is_one_line(body: str, tmp_path: Path) -> None:
    (tmp_path / "r.json").write_text(body)
    for command in (["report"], ["cost"]):
        p = bench(*command, str(tmp_path / "r.json"))
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert p.stderr.startswith("error: ") and len(p.stderr.strip().splitlines()) == 1


SHARED = json.dumps({"object": "list", "data": [
    {"id": "Qwen3.6-35B-A3B", "object": "model"}, {"id": "qwen3.6-35b-a3b", "object": "model"},
    {"id": "Qwen3.6-27B", "object": "model"},
]}).encode()  # fmt: skip  # a shared endpoint's list: the hop's own names, then the routed ones


@pytest.mark.parametrize(("profile", "model"), [("gpu-mtp", "Qwen3.6-27B"), ("graviton-moe", "Qwen3.6-35B-A3B")])
def test_at_a_shared_endpoint_the_profile_picks_its_model(profile: str, model: str, tmp_path: Path) -> None:
    """Several models behind one URL: the run requests the profile's own model, whichever the list names first."""
    with HostileServer(["ok"], models=SHARED) as server:
        p = run(server.url, tmp_path / "r.json", "--repetitions", "1", "--profile", profile)
    assert p.returncode == 0, p.stderr
    assert set(server.asked) == {model}
    assert json.loads((tmp_path / "r.json").read_text())["served_model"] == model


def test_at_a_shared_endpoint_a_profile_it_does_not_serve_is_refused_before_any_request(tmp_path: Path) -> None:
    moe_only = json.dumps({"object": "list", "data": json.loads(SHARED)["data"][:2]}).encode()
    with HostileServer(["ok"], models=moe_only) as server:
        p = run(server.url, tmp_path / "r.json", "--repetitions", "1", "--profile", "gpu-mtp")
        assert server.served == []
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    last = p.stderr.strip().splitlines()[-1]
    assert "serves several models, Qwen3.6-35B-A3B, qwen3.6-35b-a3b, not the profile's Qwen3.6-27B" in last
    assert "pass --model" in last
