"""The SageMaker container, run as SageMaker runs it, with a real llama-server and the real Gemma 3 270M GGUF.

No Docker here (the image tier does that: tests/images/test_sagemaker_contract.py): the supervisor is started with
the model folder laid out as SageMaker lays it out, the runtime spec in its environment, SAGEMAKER_BIND_TO_PORT
set, and SageMaker's side played by harness.py: pings from the start with the 2 s timeout, headers stripped.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.container.names import RUNTIME_SPEC_ENV
from gguf_serve.container.sagemaker.contract import ENDPOINT_ENV, SIGKILL_AFTER_S
from gguf_serve.container.sagemaker.serve import EX_CONFIG
from gguf_serve.local.process import free_port
from tests.committed import local_profile
from tests.conftest import ROOT
from tests.container.sagemaker.harness import Pings, invoke, sse_text

pytestmark = [pytest.mark.e2e, pytest.mark.slow]
MAIN = "import sys; from gguf_serve.container.sagemaker.serve import main; sys.exit(main(model_dir=sys.argv[1]))"


# What SageMaker hands a hosting container for its role (the container credentials endpoint's path) and a ModelScope
# token a user might set: the supervisor may hold them, llama-server gets none.
SAGEMAKER_CREDENTIALS = {
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI": "/v2/credentials/0a1b2c3d-test",
    "AWS_ACCESS_KEY_ID": "AKIAEXAMPLETEST",
    "AWS_SESSION_TOKEN": "FwoGEXAMPLETEST",
    "MODELSCOPE_API_TOKEN": "ms-EXAMPLETEST",
}


def _staged(gemma: Path, tmp: Path) -> Path:
    root = tmp / "opt-ml-model"
    model = local_profile().model
    path = root / model.repo / model.revision / model.file  # the staged key below its prefix
    path.parent.mkdir(parents=True)
    path.symlink_to(gemma)
    return root


def _start(binary: Path, root: Path, spec_json: str, port: int, log: Path) -> subprocess.Popen:
    env = {
        **os.environ,
        RUNTIME_SPEC_ENV: spec_json,
        "SAGEMAKER_BIND_TO_PORT": str(port),
        "SAGEMAKER_SAFE_PORT_RANGE": f"{(inner := free_port())}-{inner}",  # this machine runs others' servers too
        ENDPOINT_ENV: "GravitonMoeSageMakerStack",
        "PATH": f"{binary.parent}:{os.environ.get('PATH', '')}",
        **SAGEMAKER_CREDENTIALS,
    }
    with log.open("wb") as out:
        # Its own process group, as a container's processes are: the teardown ends llama-server with the supervisor.
        return subprocess.Popen([sys.executable, "-c", MAIN, str(root)], env=env, cwd=ROOT, stdout=out, stderr=out,
                                start_new_session=True)  # fmt: skip


@pytest.fixture
def container(llama_server_binary, gemma_gguf, tmp_path) -> Iterator[tuple[subprocess.Popen, Pings, Path]]:
    port = free_port()
    log = tmp_path / "container.log"
    proc = _start(llama_server_binary, _staged(gemma_gguf, tmp_path), local_profile().runtime_json(), port, log)
    pings = Pings(port, interval=0.5).start()
    try:
        yield proc, pings, log
    finally:
        pings.stop()
        with contextlib.suppress(ProcessLookupError):  # SIGKILL to the group, as a stopped container's processes get
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _wait_ready(proc: subprocess.Popen, pings: Pings, log: Path, timeout: float = 240) -> None:
    deadline = time.monotonic() + timeout
    while pings.first_ok() is None:
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, "no /ping 200 in time"
        time.sleep(0.2)


def test_pings_answer_within_a_second_503_until_the_model_is_loaded(container):
    proc, pings, log = container
    _wait_ready(proc, pings, log)
    assert all(took < 1.0 for _, status, took in pings.seen if status is not None), pings.seen
    statuses = [status for _, status, _ in pings.seen]
    first_ok = statuses.index(200)
    assert set(statuses[:first_ok]) <= {None, 503}  # nothing but "not yet" before the model is loaded
    assert statuses[0] in (None, 503) and 503 in statuses[:first_ok]
    lines = log.read_text()
    assert "matches the lock" in lines
    assert lines.index("matches the lock") < lines.index("starting llama-server")  # checked before it runs


def _children(pid: int) -> list[int]:
    return [int(c) for t in Path(f"/proc/{pid}/task").iterdir() for c in (t / "children").read_text().split()]


def test_llama_server_holds_no_credential_and_cannot_read_the_supervisors(container):
    """llama-server's own environment has no credential; the supervisor's (which holds them) is undumpable, so
    llama-server, its own user, cannot read it (that refusal needs an unprivileged reader: test_undumpable.py; here
    the reader may be root)."""
    proc, pings, log = container
    _wait_ready(proc, pings, log)
    (server,) = _children(proc.pid)
    environ = Path(f"/proc/{server}/environ").read_bytes().split(b"\0")
    names = {e.split(b"=", 1)[0].decode() for e in environ if e}
    assert "PATH" in names and not names & set(SAGEMAKER_CREDENTIALS), names
    assert not any(v.encode() in b"\0".join(environ) for v in SAGEMAKER_CREDENTIALS.values())
    if os.geteuid() != 0:
        with pytest.raises(PermissionError):
            Path(f"/proc/{proc.pid}/environ").read_bytes()
    line = next(line for line in log.read_text().splitlines() if "not passed to llama-server" in line)
    assert all(name in line for name in SAGEMAKER_CREDENTIALS)
    assert "supervisor undumpable" in log.read_text()


def test_plain_and_streamed_invocations_without_a_key(container):
    proc, pings, log = container
    _wait_ready(proc, pings, log)
    body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}
    status, _, pieces, complete = invoke(pings.port, body, {"Authorization": "Bearer would-be-stripped"})
    assert status == 200 and complete
    answer = json.loads(b"".join(p for _, p in pieces))
    assert answer["usage"]["completion_tokens"] > 0 and "timings" in answer
    status, headers, pieces, complete = invoke(pings.port, {**body, "stream": True})
    assert status == 200 and complete and headers["Content-Type"].startswith("text/event-stream")
    assert len(pieces) > 2 and sse_text(pieces)  # token by token, not one buffered answer
    assert pieces[0][0] < pieces[-1][0]
    status, _, pieces, _ = invoke(pings.port, {}, {"X-Amzn-SageMaker-Custom-Attributes": "route=/v1/models"})
    assert status == 200 and json.loads(b"".join(p for _, p in pieces))["data"][0]["id"] == "Gemma-3-270M"


def test_sigterm_drains_within_sagemakers_30_s_and_counts_what_it_cut(container):
    import threading

    proc, pings, log = container
    _wait_ready(proc, pings, log)
    result: dict = {}
    body = {"messages": [{"role": "user", "content": "Count from 1 to 2000."}], "max_tokens": 4000, "stream": True}
    stream = threading.Thread(target=lambda: result.update(zip("shpc", invoke(pings.port, body), strict=True)))
    stream.start()
    while not os.path.exists(log) or "processing task" not in log.read_text():
        time.sleep(0.1)
    time.sleep(1.0)
    signalled = time.monotonic()
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=SIGKILL_AFTER_S + 5)
    took = time.monotonic() - signalled
    stream.join(30)
    assert code == 0 and took < SIGKILL_AFTER_S, (code, took)
    text = log.read_text()
    summary = next(line for line in text.splitlines() if "drain (SIGTERM):" in line)
    emf = next(json.loads(line) for line in text.splitlines() if line.startswith('{"_aws"') and "Drains" in line)
    cut_in_log = int(summary.split(" streams finished, ")[1].split(" cut")[0])
    assert emf["DrainStreamsCut"] == cut_in_log and emf["DrainStreamsCut"] + emf["DrainStreamsFinished"] == 1
    assert result["c"] is (emf["DrainStreamsCut"] == 0)  # the client saw a cut stream exactly when one was counted


def test_a_file_that_is_not_the_locked_one_is_refused_and_never_ready(llama_server_binary, gemma_gguf, tmp_path):
    spec = local_profile().runtime()
    wrong = replace(spec, model=replace(spec.model, sha256="0" * 64))
    port = free_port()
    log = tmp_path / "container.log"
    proc = _start(llama_server_binary, _staged(gemma_gguf, tmp_path), wrong.to_json(), port, log)
    pings = Pings(port, interval=0.2).start()
    try:
        assert proc.wait(timeout=120) == EX_CONFIG
    finally:
        pings.stop()
    assert pings.first_ok() is None
    assert f"but Gemma-3-270M is locked at {'0' * 64}" in log.read_text()
