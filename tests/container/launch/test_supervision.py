"""The server comes back after being killed, under the unit's restart rules (tests/container/launch/supervisor.py)."""

from __future__ import annotations

import os
import signal
import time

import pytest

from gguf_serve.local.process import free_port, start_server
from tests.committed import PROFILES, local_profile

from .supervisor import Supervisor, restart_wanted


@pytest.mark.parametrize(
    ("code", "restart"),
    [(0, True), (1, True), (137, True), (-signal.SIGKILL, True), (-signal.SIGSEGV, True),
     (-signal.SIGTERM, True), (-signal.SIGINT, True), (78, False)],
)  # fmt: skip
def test_restart_rules_match_systemd_always(code, restart):
    assert restart_wanted(code, frozenset({78})) is restart


@pytest.mark.e2e
def test_killed_server_is_restarted_and_healthy_again(llama_server_binary, gemma_gguf, tmp_path):
    profile = local_profile(port=free_port())  # a fixed port across restarts, as on an instance
    runs = iter(range(100))

    def start():
        return start_server(
            profile, gemma_gguf.parent, binary=llama_server_binary, api_key="k", workdir=tmp_path / f"run{next(runs)}"
        )

    sup = Supervisor(start, restart_sec=5.0).run()
    try:
        first = sup.current
        first.wait_healthy(timeout=120)
        os.kill(first.pid, signal.SIGKILL)  # the pid is llama-server's: the launcher exec()ed it
        killed_at = time.monotonic()
        second = sup.wait_for_new_process(first, timeout=30)
        assert second is not first, f"not restarted; exits {sup.exits}"
        assert time.monotonic() - killed_at >= 4.9  # RestartSec=5
        second.wait_healthy(timeout=120)
        assert sup.exits == [-signal.SIGKILL]
        assert second.health() == 200
    finally:
        sup.stop()
    assert sup.exits[-1] == 0 or sup.exits[-1] == -signal.SIGTERM  # a clean stop is not restarted
    assert not sup.alive


def test_launcher_refusal_is_not_restarted(sentinel_binary, tmp_path):
    binary, record = sentinel_binary
    profile = PROFILES["gpu-mtp"]  # its model file is not in tmp_path: the launcher exits 78
    sup = Supervisor(
        lambda: start_server(profile, tmp_path, binary=binary, api_key="k", workdir=tmp_path / "w"),
        restart_sec=0.1,
    ).run()
    sup._thread.join(10)
    assert sup.exits == [78]
    assert not record.exists()
