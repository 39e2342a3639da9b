"""The MTP path for real on CPU: a tiny random GGUF of the Qwen3.6 architecture with an MTP layer, made here by
tests/rehearsal/tiny_mtp.py, served through the launcher with the GPU profile's speculative flags (draft-mtp, 2 drafts,
one slot) by the pinned llama-server; the answers carry drafted and accepted tokens."""

from __future__ import annotations

import json
import secrets
import urllib.request
from pathlib import Path

import pytest

from tests.committed import local_profile
from tests.rehearsal.tiny_mtp import artifact, with_gpu_speculation, write

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]


def _profile(gguf: Path, port: int):
    return with_gpu_speculation(local_profile(model=artifact(gguf), port=port))


def _chat(url: str, key: str) -> dict:
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 48, "temperature": 0}
    request = urllib.request.Request(
        f"{url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=120) as r:
        return json.load(r)


@pytest.mark.parametrize("agree", [False, True], ids=["random-heads", "agreeing-heads"])
def test_llama_server_drafts_with_the_mtp_layer_on_cpu(llama_server_binary, tmp_path, agree):
    from gguf_serve.container.fetch.gguf import summarize
    from gguf_serve.local.process import free_port, start_server

    models = tmp_path / "models"
    models.mkdir()
    gguf = write(models / "qwen36-tiny-mtp.gguf", agree=agree)
    summary = summarize(gguf)
    assert (summary.architecture, summary.nextn_predict_layers) == ("qwen35", 1)
    profile = _profile(gguf, free_port())
    assert profile.mtp and profile.server.speculative.spec_type == "draft-mtp"
    key = secrets.token_urlsafe(16)
    server = start_server(profile, gguf.parent, binary=llama_server_binary, api_key=key, workdir=tmp_path)
    try:
        server.wait_healthy(timeout=60)
        timings = _chat(server.url, key)["timings"]
        assert timings["draft_n"] > 0, timings  # the MTP head drafted
        if agree:
            assert timings["draft_n_accepted"] == timings["draft_n"], timings
        else:
            assert 0 <= timings["draft_n_accepted"] <= timings["draft_n"], timings
        request = urllib.request.Request(f"{server.url}/metrics", headers={"Authorization": f"Bearer {key}"})
        with urllib.request.urlopen(request, timeout=10) as r:
            metrics = dict(line.rsplit(" ", 1) for line in r.read().decode().splitlines() if line[:1] not in "#")
        assert float(metrics["llamacpp:spec_decode_num_draft_tokens_total"]) == timings["draft_n"]
        assert float(metrics["llamacpp:spec_decode_num_accepted_tokens_total"]) == timings["draft_n_accepted"]
    finally:
        server.stop()
