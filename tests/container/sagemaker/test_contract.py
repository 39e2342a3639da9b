"""The container side of SageMaker's contract, piece by piece: mode, ports, spec, routes and the model check."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from gguf_serve.container.launch.preflight import LaunchRefused
from gguf_serve.container.names import RUNTIME_SPEC_ENV
from gguf_serve.container.sagemaker import routes
from gguf_serve.container.sagemaker.mode import sagemaker_mode
from gguf_serve.container.sagemaker.model import verify_model
from gguf_serve.container.sagemaker.serve import Ports, load_spec, ports
from tests.container.sagemaker.conftest import FILE, KEY_DIR, with_model, write_gguf


def test_only_a_bare_serve_with_sagemaker_signs_is_sagemaker(tmp_path: Path):
    absent = str(tmp_path / "none")
    assert sagemaker_mode(["serve"], {RUNTIME_SPEC_ENV: "{}"}, absent)
    assert sagemaker_mode(["serve"], {}, str(tmp_path))  # SageMaker's model folder alone
    assert not sagemaker_mode(["serve"], {}, absent)  # a local `docker run <image>`: the EC2/local path
    ec2 = ["serve", "--spec", "/etc/gguf-serve/runtime.json", "--model-dir", "/models"]
    assert not sagemaker_mode(ec2, {RUNTIME_SPEC_ENV: "{}"}, str(tmp_path))  # the boot script's line, unchanged
    assert not sagemaker_mode(["fetch"], {RUNTIME_SPEC_ENV: "{}"}, str(tmp_path))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({}, Ports(8080, 8081)),
        ({"SAGEMAKER_BIND_TO_PORT": "9000"}, Ports(9000, 8081)),
        ({"SAGEMAKER_BIND_TO_PORT": "8081"}, Ports(8081, 8082)),
        ({"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_SAFE_PORT_RANGE": "9000-9005"}, Ports(9000, 9001)),
        ({"SAGEMAKER_SAFE_PORT_RANGE": "20000-20999"}, Ports(8080, 20000)),
    ],
)
def test_ports_follow_sagemakers_variables(env, expected):
    assert ports(env) == expected


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SAGEMAKER_BIND_TO_PORT": "http"}, "SAGEMAKER_BIND_TO_PORT='http' is not a TCP port"),
        ({"SAGEMAKER_BIND_TO_PORT": "70000"}, "not a TCP port"),
        ({"SAGEMAKER_BIND_TO_PORT": "9000", "SAGEMAKER_SAFE_PORT_RANGE": "9000"}, "leaves no port for llama-server"),
        ({"SAGEMAKER_SAFE_PORT_RANGE": "a-b"}, "SAGEMAKER_SAFE_PORT_RANGE='a' is not a TCP port"),
    ],
)
def test_bad_port_variables_are_refused_in_one_line(env, match):
    with pytest.raises(LaunchRefused, match=match):
        ports(env)


def test_the_spec_comes_from_the_environment(staged):
    _, spec = staged
    assert load_spec({RUNTIME_SPEC_ENV: spec.to_json()}) == spec
    with pytest.raises(LaunchRefused, match="GGUF_SERVE_RUNTIME_SPEC is not set: the SageMaker model's Environment"):
        load_spec({})
    with pytest.raises(LaunchRefused, match="GGUF_SERVE_RUNTIME_SPEC is not JSON"):
        load_spec({RUNTIME_SPEC_ENV: "{not json"})


@pytest.mark.parametrize(
    ("header", "path"),
    [
        (None, b"/v1/chat/completions"),
        (b"", b"/v1/chat/completions"),
        (b"trace=abc", b"/v1/chat/completions"),
        (b"route=/v1/completions", b"/v1/completions"),
        (b"trace=abc; route = /completion ,x=y", b"/completion"),
        (b"Route=/v1/models", b"/v1/models"),
    ],
)
def test_custom_attributes_select_a_listed_route(header, path):
    assert routes.select(header).path == path


@pytest.mark.parametrize(
    ("header", "match"),
    [
        (b"route=/slots", "route '/slots' is not served here; use one of /v1/chat/completions"),
        (b"route=/v1/models;route=/props", "more than one route"),
        (b"route=" + b"x" * 1100, "over 1024 characters"),
        (b"route=/../metrics", "is not served here"),
    ],
)
def test_unlisted_routes_are_refused(header, match):
    with pytest.raises(routes.RouteRefused, match=match):
        routes.select(header)


def test_the_locked_file_passes_and_says_so(staged):
    root, spec = staged
    lines = []
    path = verify_model(spec, root, log=lines.append)
    assert path == root / KEY_DIR / FILE
    assert lines and "matches the lock" in lines[0] and spec.model.sha256[:12] in lines[0]


def test_a_second_file_is_refused(staged):
    root, spec = staged
    (root / "notes.txt").write_text("x")
    with pytest.raises(LaunchRefused, match=r"must hold exactly one file, the locked GGUF; found 2 \(notes.txt"):
        verify_model(spec, root)


def test_no_model_folder_or_no_file_is_refused(staged, tmp_path):
    root, spec = staged
    with pytest.raises(LaunchRefused, match="does not exist: the SageMaker model needs ModelDataSource"):
        verify_model(spec, tmp_path / "absent")
    shutil.rmtree(root / "unsloth")
    with pytest.raises(LaunchRefused, match="found 0 .nothing."):
        verify_model(spec, root)


def test_another_file_of_the_same_size_is_refused_by_its_sha256(staged):
    root, spec = staged
    path = root / KEY_DIR / FILE
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF  # a flipped bit in the tensor data: same size, same header
    path.write_bytes(bytes(data))
    with pytest.raises(LaunchRefused, match=f"has sha256 [0-9a-f]{{64}}, but Tiny is locked at {spec.model.sha256}"):
        verify_model(spec, root)


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"sha256": None}, "pins no sha256"),
        ({"file": "other.gguf"}, "is not other.gguf"),
        ({"size_bytes": 1}, "bytes but Tiny is 1 bytes"),
        ({"gguf_architecture": "gemma3"}, "is a 'qwen35moe' model but profile 'tiny' expects 'gemma3'"),
    ],
)
def test_a_file_that_is_not_the_pinned_one_is_refused(staged, changes, match):
    root, spec = staged
    with pytest.raises(LaunchRefused, match=match):
        verify_model(with_model(spec, **changes), root)


def test_a_gguf_of_another_architecture_under_the_right_name_is_refused(tmp_path, staged):
    _, spec = staged
    root = tmp_path / "other"
    write_gguf(root / FILE, arch="gemma3")
    with pytest.raises(LaunchRefused, match="bytes but Tiny is|is a 'gemma3' model"):
        verify_model(spec, root)


def test_the_image_says_it_takes_sagemakers_port():
    from gguf_serve.container.sagemaker.contract import BIND_PORT_LABEL
    from tests.conftest import ROOT

    dockerfile = (ROOT / "docker" / "app.Dockerfile").read_text()
    image_stage = dockerfile.split("FROM ${CHECK_IMAGE}")[0]  # the stage the serving image is built FROM
    assert f"LABEL {BIND_PORT_LABEL}=true" in image_stage.splitlines()


def test_the_images_healthcheck_asks_the_port_sagemaker_gave(monkeypatch, tmp_path):
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from gguf_serve.container.launch import health

    class Ok(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200 if self.path == "/health" else 404)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Ok)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        monkeypatch.setenv("SAGEMAKER_BIND_TO_PORT", str(server.server_address[1]))
        assert health.check(str(tmp_path / "no-spec.json"), 2.0) == 0  # no runtime spec file on SageMaker
        spec = tmp_path / "runtime.json"
        spec.write_text('{"server": {"port": 1}}')  # the EC2 instance's spec wins where there is one
        assert health.check(str(spec), 2.0) == 1
    finally:
        server.shutdown()
