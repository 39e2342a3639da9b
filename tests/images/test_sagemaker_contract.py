"""The serving image run the way SageMaker runs it: SageMaker's container contract, rehearsed in Docker.

The x86-64 image built from the synthesized asset (the IntelMoeStack's, which IntelMoeSageMakerStack's model names:
checked below), started as SageMaker starts it: `docker run <image> serve`, no --user (the image's own), the model's
Environment, the model data read-only at /opt/ml/model in the staged layout. SageMaker's side (harness.py): pings
every 5 s with a 2 s timeout from the start, requests with the headers SageMaker strips stripped, a plain and a
streamed invocation, and `docker stop -t 30` during a stream: SIGTERM, SIGKILL 30 s later, as SageMaker stops a
container on scale-in or update. The real Gemma 3 270M GGUF generates.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gguf_serve.catalog.images import BUILD_STAGES
from gguf_serve.container.names import RUNTIME_SPEC_ENV
from gguf_serve.container.sagemaker.contract import BIND_PORT_LABEL, ENDPOINT_ENV, MODEL_DIR, SIGKILL_AFTER_S
from gguf_serve.local.process import free_port
from tests.committed import local_profile
from tests.container.sagemaker.harness import Pings, invoke, sse_text
from tests.images.buildspec import BuildInputs, build_inputs, run_buildspec
from tests.images.engine import CACHE, LocalRegistry, docker, ensure_engine
from tests.images.scenario import UID

pytestmark = [pytest.mark.images, pytest.mark.slow, pytest.mark.timeout(3600)]


@pytest.fixture(scope="module")
def image(image_assembly: Path, tmp_path_factory) -> Iterator[BuildInputs]:
    ensure_engine()
    inputs = build_inputs(image_assembly, "IntelMoeStack")
    sagemaker = json.loads((image_assembly / "IntelMoeSageMakerStack.template.json").read_text())
    (model,) = [r for r in sagemaker["Resources"].values() if r["Type"] == "AWS::SageMaker::Model"]
    assert model["Properties"]["PrimaryContainer"]["Image"]["Fn::Join"][1][-1] == f":{inputs.env['IMAGE_TAG']}"
    registry = LocalRegistry(tmp_path_factory.mktemp("registry"))
    try:
        work = tmp_path_factory.mktemp("codebuild")
        for stage in BUILD_STAGES:  # a stage whose tag exists (the image tier's base) is not built again
            run_buildspec(inputs, work, stage=stage, registry=registry)
        yield inputs
    finally:
        registry.close()


def _model_dir(gemma: Path, tmp: Path, mode: int = 0o644) -> tuple[Path, str]:
    """The staged object as SageMaker copies it under /opt/ml/model (owned by root, as its agent writes it)."""
    profile = local_profile()
    root = tmp / "opt-ml-model"
    path = root / profile.model.repo / profile.model.revision / profile.model.file
    path.parent.mkdir(parents=True)
    shutil.copyfile(gemma, path)  # a copy: the mount must not reach the shared cache through a link
    path.chmod(mode)
    runtime = local_profile().runtime()
    return root, runtime.to_json()


def _run(image: str, root: Path, spec: str, port: int, *, inside: int = 8080, options: tuple[str, ...] = ()) -> str:
    """`docker run <image> serve` as SageMaker runs it; the container's port `inside` published on loopback."""
    name = f"gguf-serve-sagemaker-{secrets.token_hex(4)}"
    docker(
        "run", "-d", "--name", name, "-p", f"127.0.0.1:{port}:{inside}", "-v", f"{root}:{MODEL_DIR}:ro",
        "-e", f"{RUNTIME_SPEC_ENV}={spec}", "-e", f"{ENDPOINT_ENV}=rehearsal", *options, image, "serve",
    )  # fmt: skip
    return name


def test_the_image_carries_the_label_and_serves_sagemakers_contract(image, gemma_gguf, tmp_path):
    labels = json.loads(docker("image", "inspect", image.image).stdout)[0]["Config"]["Labels"]
    assert labels[BIND_PORT_LABEL] == "true"
    root, spec = _model_dir(gemma_gguf, tmp_path)
    port = free_port()
    name = _run(image.image, root, spec, port)
    pings = Pings(port, interval=5.0).start()  # SageMaker's: every few seconds, 2 s timeout, from the start
    try:
        deadline = time.monotonic() + 300
        while pings.first_ok() is None and time.monotonic() < deadline:
            assert docker("inspect", "-f", "{{.State.Running}}", name).stdout.strip() == "true", _logs(name)
            time.sleep(0.5)
        assert pings.first_ok() is not None, _logs(name)
        answered = [(s, took) for _, s, took in pings.seen if s is not None]
        assert all(took < 1.0 for _, took in answered) and answered[-1][0] == 200, pings.seen
        assert {s for s, _ in answered[:-1]} <= {503}  # nothing but "not yet" before the model is loaded
        assert docker("exec", name, "id", "-u").stdout.strip() == UID  # as SageMaker runs it: the image's user

        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 12}
        status, _, pieces, complete = invoke(port, body, {"Authorization": "Bearer stripped-by-sagemaker"})
        assert status == 200 and complete and json.loads(b"".join(p for _, p in pieces))["usage"]["completion_tokens"]
        status, headers, pieces, complete = invoke(port, {**body, "stream": True})
        assert status == 200 and complete and headers["Content-Type"].startswith("text/event-stream")
        assert len(pieces) > 2 and sse_text(pieces)

        result: dict = {}
        long = {"messages": [{"role": "user", "content": "Count to 3000."}], "max_tokens": 6000, "stream": True}
        stream = threading.Thread(target=lambda: result.update(zip("shpc", invoke(port, long), strict=True)))
        stream.start()
        time.sleep(3)
        started = time.monotonic()
        docker("stop", "-t", str(int(SIGKILL_AFTER_S)), name, timeout=60)  # SIGTERM, SIGKILL 30 s later
        took = time.monotonic() - started
        stream.join(30)
        state = json.loads(docker("inspect", name).stdout)[0]["State"]
        logs = _logs(name)
        assert state["ExitCode"] == 0 and took < SIGKILL_AFTER_S, (state, took, logs[-2000:])  # drained, not killed
        drain = next(json.loads(line) for line in logs.splitlines() if line.startswith('{"_aws"') and "Drains" in line)
        assert drain["DrainStreamsCut"] + drain["DrainStreamsFinished"] == 1
        assert drain["EndpointName"] == "rehearsal" and "drain (SIGTERM):" in logs
        assert result["c"] is (drain["DrainStreamsCut"] == 0)
        report = {
            "first_ping_200_s": pings.first_ok(), "pings": len(pings.seen), "stop_s": round(took, 1),
            "streams_cut": drain["DrainStreamsCut"], "streams_finished": drain["DrainStreamsFinished"],
        }  # fmt: skip
        (CACHE / "image-tier").mkdir(parents=True, exist_ok=True)
        (CACHE / "image-tier" / "sagemaker-contract.json").write_text(json.dumps(report))
    finally:
        pings.stop()
        docker("rm", "-f", name, check=False)


def test_root_and_another_port_as_the_documentation_expects(image, gemma_gguf, tmp_path):
    """SageMaker's guide expects containers to run as root, and may pass SAGEMAKER_BIND_TO_PORT: both work."""
    root, spec = _model_dir(gemma_gguf, tmp_path)
    port = free_port()
    options = ("--user", "0", "-e", "SAGEMAKER_BIND_TO_PORT=9000", "-e", "SAGEMAKER_SAFE_PORT_RANGE=9100-9110")
    name = _run(image.image, root, spec, port, inside=9000, options=options)
    pings = Pings(port, interval=1.0).start()
    try:
        deadline = time.monotonic() + 300
        while pings.first_ok() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert pings.first_ok() is not None, _logs(name)
        status, _, _, complete = invoke(port, {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4})
        assert status == 200 and complete
        assert "llama-server on 127.0.0.1:9100" in _logs(name)
        deadline = time.monotonic() + 90  # the image's HEALTHCHECK asks SAGEMAKER_BIND_TO_PORT, every 15 s
        while docker("inspect", "-f", "{{.State.Health.Status}}", name).stdout.strip() != "healthy":
            assert time.monotonic() < deadline, docker("inspect", "-f", "{{json .State.Health}}", name).stdout
            time.sleep(1)
    finally:
        pings.stop()
        docker("rm", "-f", name, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="the model folder must be owned by root, as SageMaker's agent owns it")
def test_a_model_the_image_user_cannot_read_is_refused_with_why(image, gemma_gguf, tmp_path):
    root, spec = _model_dir(gemma_gguf, tmp_path, mode=0o600)
    name = _run(image.image, root, spec, free_port())
    try:
        code = docker("wait", name, timeout=120).stdout.strip()
        assert code == "78", _logs(name)
        assert f"is not readable by uid {UID} (owner 0, mode 600)" in _logs(name)
    finally:
        docker("rm", "-f", name, check=False)


def _logs(name: str) -> str:
    out = docker("logs", name, check=False)
    return out.stdout + out.stderr
