"""The pod drain: a preStop hook's SIGUSR1 puts the hop into a drain, running streams finish, the outcome file says so.

In-process for the drain's logic (the scripted upstream of conftest.py holds a stream open until its gate opens),
and once as the container runs it: the hop as its own process (`python3 -m gguf_serve.container.hop --pod-drain`) and
the preStop command (`python3 -m gguf_serve.container.hop.pod prestop`) signalling it by pid.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from gguf_serve.container.hop.pod import DrainOutcome, PodDrainer, prestop
from gguf_serve.container.hop.proxy import ProxyServer
from gguf_serve.local.process import free_port
from tests.conftest import ROOT
from tests.container.hop.conftest import KEY, TEST_GATE, Upstream


def _conn(server: ProxyServer | int) -> http.client.HTTPConnection:
    port = server if isinstance(server, int) else server.server_address[1]
    return http.client.HTTPConnection("127.0.0.1", port, timeout=10)


def _stream(port: int) -> http.client.HTTPResponse:
    conn = _conn(port)
    body = json.dumps({"stream": True, "messages": []})
    conn.request("POST", "/v1/chat/completions", body, {"Authorization": f"Bearer {KEY}"})
    return conn.getresponse()


def _get(port: int, path: str) -> int:
    conn = _conn(port)
    conn.request("GET", path)
    return conn.getresponse().status


def _until(predicate, seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached in time"
        time.sleep(0.02)


@pytest.fixture
def drained(upstream: Upstream, tmp_path: Path):
    def start(deadline_s: float) -> tuple[ProxyServer, PodDrainer]:
        drainer = PodDrainer(deadline_s=deadline_s, report=tmp_path / "drain.json", poll_s=0.05)
        server = ProxyServer(("127.0.0.1", 0), upstream.url, drainer=drainer, gate=TEST_GATE)  # type: ignore[arg-type]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        started.append(server)
        return server, drainer

    started: list[ProxyServer] = []
    yield start
    for server in started:
        server.shutdown()
        server.server_close()


def test_a_running_stream_finishes_new_requests_are_refused_and_the_outcome_says_zero_cut(upstream, drained):
    hop, drainer = drained(30)
    port = hop.server_address[1]
    running = _stream(port)
    assert running.status == 200
    _until(lambda: hop.in_flight == 1)
    drainer.request()  # what the SIGUSR1 handler does
    _until(lambda: hop.drain is not None)
    assert _get(port, "/health") == 503  # the readiness probe fails: the pod leaves the Service
    refused = _stream(port)
    assert refused.status == 503 and refused.getheader("Retry-After")
    assert not drainer.report.exists()  # the stream still runs: the preStop hook keeps waiting
    upstream.gate.set()
    assert running.read().endswith(b"data: [DONE]\n\n")
    _until(drainer.report.exists)
    outcome = DrainOutcome(**json.loads(drainer.report.read_text()))
    assert (outcome.finished, outcome.cut, outcome.refused, outcome.reason) == (1, 0, 1, "pod terminating")


def test_a_stream_past_the_deadline_is_counted_cut(upstream, drained):
    hop, drainer = drained(0.3)
    running = _stream(hop.server_address[1])
    assert running.status == 200
    _until(lambda: hop.in_flight == 1)
    drainer.request()
    _until(drainer.report.exists)
    outcome = DrainOutcome(**json.loads(drainer.report.read_text()))
    assert (outcome.finished, outcome.cut) == (0, 1)
    upstream.gate.set()


def test_an_idle_hop_drains_at_once_and_an_old_outcome_is_not_taken_for_this_one(tmp_path, upstream):
    report = tmp_path / "drain.json"
    report.write_text(json.dumps({"reason": "old", "finished": 9, "cut": 9, "broken": 0, "refused": 0, "seconds": 1}))
    drainer = PodDrainer(deadline_s=30, report=report, poll_s=0.05)
    assert not report.exists()
    hop = ProxyServer(("127.0.0.1", 0), upstream.url, drainer=drainer, gate=TEST_GATE)  # type: ignore[arg-type]
    threading.Thread(target=hop.serve_forever, daemon=True).start()
    try:
        drainer.request()
        _until(report.exists)
        assert json.loads(report.read_text())["finished"] == 0
    finally:
        hop.shutdown()
        hop.server_close()


def test_the_deadline_must_be_positive(tmp_path):
    with pytest.raises(ValueError, match="deadline"):
        PodDrainer(deadline_s=0, report=tmp_path / "d.json")


def test_prestop_with_no_hop_says_so_and_lets_the_pod_go(tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert prestop(dead.pid, tmp_path / "d.json", wait_s=1) == 0
    assert "nothing to drain" in capsys.readouterr().out


def test_the_hop_process_drains_on_the_prestop_commands_signal(upstream: Upstream, tmp_path: Path):
    """As in the pod: the hop is its own process started with --pod-drain; the preStop command signals it by pid
    and returns only once the running stream has finished."""
    port, report = free_port(), tmp_path / "drain.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    hop = subprocess.Popen(
        [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}", "--upstream", upstream.url,
         "--gpu-metrics", "off", "--drain-deadline", "30", "--pod-drain", str(report), "--no-api-key", "t"],
        env=env, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        _until(lambda: _reachable(port), 15)
        running = _stream(port)
        assert running.status == 200
        hook = subprocess.Popen(
            [sys.executable, "-m", "gguf_serve.container.hop.pod", "prestop", "--pid", str(hop.pid),
             "--report", str(report), "--wait", "20"],
            env=env, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        _until(lambda: _get(port, "/health") == 503, 10)
        time.sleep(0.3)
        assert hook.poll() is None, "the preStop hook returned while a stream was running"
        upstream.gate.set()
        assert running.read().endswith(b"data: [DONE]\n\n")
        out, _ = hook.communicate(timeout=15)
        assert hook.returncode == 0
        assert '"cut": 0' in out and '"finished": 1' in out, out
    finally:
        hop.terminate()
        _, err = hop.communicate(timeout=10)
    assert "drain on SIGUSR1" in err and "drain (pod terminating): 1 streams finished, 0 cut" in err, err


def test_pod_drain_and_instance_metadata_are_one_or_the_other(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{free_port()}", "--pod-drain",
         str(tmp_path / "d.json"), "--drain-imds", "http://127.0.0.1:9", "--no-api-key", "t"],
        capture_output=True, text=True, timeout=30, env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert out.returncode == 2 and "use one" in out.stderr


def _reachable(port: int) -> bool:
    try:
        return _get(port, "/health") in (200, 502, 503)
    except OSError:
        return False
