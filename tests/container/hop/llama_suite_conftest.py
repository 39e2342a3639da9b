"""Copied over the conftest.py of llama.cpp's server tests (tools/server/tests, from the pinned sdist) when
tests/container/hop/test_transparency.py runs them: no model downloads (Hugging Face is out of reach), the
presets point at the local GGUF in GGUF_SERVE_MODEL, and with GGUF_SERVE_THROUGH_HOP=1 every server the tests
start is reached through the hop: llama-server on a free port, the hop on the port the test talks to."""

from __future__ import annotations

import os
import socket
import sys
import threading
import types

import pytest

sys.modules.setdefault("wget", types.ModuleType("wget"))  # utils imports it for downloads, which never happen here

import utils  # noqa: E402 - after the stand-in above

MODEL = os.environ["GGUF_SERVE_MODEL"]
THROUGH_HOP = os.environ.get("GGUF_SERVE_THROUGH_HOP") == "1"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _local(preset):
    def make() -> utils.ServerProcess:
        server = preset()
        server.model_hf_repo = server.model_hf_file = None
        server.model_file = MODEL
        server.n_predict = min(server.n_predict or 8, 8)  # a bounded run on 2 cores; the same both ways
        return server

    return staticmethod(make)


for _name in ("tinyllama2", "tinygemma3", "stories15m_moe"):
    if hasattr(utils.ServerPreset, _name):
        setattr(utils.ServerPreset, _name, _local(getattr(utils.ServerPreset, _name)))
utils.ServerPreset.load_all = staticmethod(lambda: None)
os.environ.setdefault("PORT", str(_free_port()))  # read by every ServerProcess(), some made at import


if THROUGH_HOP:
    from gguf_serve.container.hop.auth import ApiKeys
    from gguf_serve.container.hop.proxy import ProxyServer

    _start, _stop = utils.ServerProcess.start, utils.ServerProcess.stop

    def start(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
        public = self.server_port
        self.server_port = _free_port()
        try:
            _start(self, timeout_seconds)  # llama-server on the free port, healthy
        finally:
            upstream, self.server_port = self.server_port, public
        # the hop knows the key as on an instance: test_security.py's keyless requests are answered by it
        keys = ApiKeys(self.api_key.split(",")) if getattr(self, "api_key", None) else None
        gate = "" if keys else "llama.cpp's own suite, keyless presets"
        self._hop = ProxyServer(
            (self.server_host.split(",")[0], public), f"http://127.0.0.1:{upstream}", keys=keys, gate=gate
        )
        threading.Thread(target=self._hop.serve_forever, daemon=True).start()

    def stop(self) -> None:
        hop = getattr(self, "_hop", None)
        if hop is not None:
            hop.shutdown()
            hop.server_close()
            self._hop = None
        _stop(self)

    utils.ServerProcess.start, utils.ServerProcess.stop = start, stop


@pytest.fixture(autouse=True)
def stop_server_after_each_test():
    yield
    for server in set(utils.server_instances):
        server.stop()
