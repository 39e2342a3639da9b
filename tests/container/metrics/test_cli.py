"""The command line: arguments, the API key sources, IMDSv2, --once into moto, and the loop under SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.cli import main
from gguf_serve.container.metrics.scrape import ApiKeySource, ScrapeError, instance_id_from_imds, read_env_file
from tests.container.metrics.conftest import GROUP, INSTANCE, datapoints, dimension_sets, metrics_text

ROOT = Path(__file__).resolve().parents[3]


def run_module(*args: str, timeout: float = 30, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), **kw.pop("env", {})}
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.metrics", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        **kw,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ([], "the following arguments are required: --group"),
        (["--group", "g", "--interval", "0"], "must be at least 1"),
        (["--group", "g", "--slots", "-2"], "must be at least 1"),
        (["--group", "g", "--url", "127.0.0.1:8080"], "expected http(s)://host:port"),
        (["--group", "g", "--api-key-env", "K", "--api-key-env-file", "/x"], "not allowed with argument"),
        (["--group", "g", "--interval", "soon"], "invalid _positive_int value"),
    ],
)
def test_bad_arguments_exit_2(args, message, capsys):
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == 2
    assert message in capsys.readouterr().err


def test_empty_group_exits_2(caplog):
    assert main(["--group", " ", "--instance-id", INSTANCE, "--dry-run", "--once"]) == 2
    assert "--group must not be empty" in caplog.text


def test_module_entry_point_runs():
    out = run_module("--help")
    assert out.returncode == 0 and "--api-key-env-file" in out.stdout
    assert run_module("--interval", "1").returncode == 2


def test_env_file_forms(tmp_path):
    text = '# written by the boot script\nexport LLAMA_API_KEY="k1=with=equals"\nOTHER=x\n\nNOEQUALS\n'
    assert read_env_file(text) == {"LLAMA_API_KEY": "k1=with=equals", "OTHER": "x"}
    assert read_env_file("LLAMA_API_KEY='single quoted' \n")["LLAMA_API_KEY"] == "single quoted"
    path = tmp_path / "api.env"
    path.write_text("LLAMA_API_KEY=abc\n")
    assert ApiKeySource(env_file=path).read() == "abc"


def test_key_source_errors_are_scrape_errors(tmp_path, monkeypatch):
    with pytest.raises(ScrapeError, match="cannot read API key file"):
        ApiKeySource(env_file=tmp_path / "missing.env").read()
    (tmp_path / "empty.env").write_text("OTHER=1\n")
    with pytest.raises(ScrapeError, match="has no LLAMA_API_KEY="):
        ApiKeySource(env_file=tmp_path / "empty.env").read()
    monkeypatch.delenv("NOT_SET_HERE", raising=False)
    with pytest.raises(ScrapeError, match="NOT_SET_HERE is not set"):
        ApiKeySource(env_name="NOT_SET_HERE").read()
    assert ApiKeySource().read() is None


def test_once_with_key_file_publishes_to_cloudwatch(fake_server, cloudwatch, tmp_path):
    key_file = tmp_path / "api.env"
    key_file.write_text(f"LLAMA_API_KEY={fake_server.api_key}\n")
    fake_server.metrics = metrics_text(requests_processing=2, requests_deferred=1)
    argv = ["--url", fake_server.url, "--api-key-env-file", str(key_file), "--group", GROUP]
    argv += ["--instance-id", INSTANCE, "--region", "cn-northwest-1", "--once"]
    assert main(argv) == 0
    assert dimension_sets(cloudwatch, names.NAMESPACE, names.REQUESTS_DEFERRED) == [
        {names.DIM_GROUP: GROUP},
        {names.DIM_GROUP: GROUP, names.DIM_INSTANCE: INSTANCE},
    ]
    (point,) = datapoints(cloudwatch, names.NAMESPACE, names.SLOTS_BUSY_RATIO, {names.DIM_INSTANCE: INSTANCE})
    assert point["Maximum"] == 50.0
    assert fake_server.requests[0] == ("/metrics", f"Bearer {fake_server.api_key}")


def test_once_with_unreachable_server_exits_0_with_scrape_failed(cloudwatch, monkeypatch):
    monkeypatch.setenv("MY_KEY", "k")
    argv = ["--url", "http://127.0.0.1:9", "--api-key-env", "MY_KEY", "--group", GROUP, "--instance-id", INSTANCE]
    assert main([*argv, "--namespace", "Test/Other", "--once"]) == 0
    (point,) = datapoints(cloudwatch, "Test/Other", names.SCRAPE_FAILED, {names.DIM_GROUP: GROUP})
    assert point["Maximum"] == 1.0


class FakeImds:
    """IMDSv2 only: the instance id needs a token from PUT /latest/api/token."""

    def __init__(self, instance_id: str = INSTANCE) -> None:
        token = "imds-token"
        self.seen: list[str] = []
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def do_PUT(self) -> None:  # noqa: N802
                seen.append(f"PUT {self.path}")
                ok = self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds")
                self._send(200 if ok else 400, token if ok else "")

            def do_GET(self) -> None:  # noqa: N802
                seen.append(f"GET {self.path}")
                if self.headers.get("X-aws-ec2-metadata-token") != token:
                    return self._send(401, "")
                if self.path == "/latest/meta-data/instance-id":
                    return self._send(200, instance_id)
                return self._send(404, "")

            def _send(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def imds():
    server = FakeImds()
    yield server
    server.close()


def test_instance_id_from_imdsv2_uses_a_token(imds):
    assert instance_id_from_imds(imds.url) == INSTANCE
    assert imds.seen == ["PUT /latest/api/token", "GET /latest/meta-data/instance-id"]


def test_cli_reads_instance_id_from_imds_endpoint_variable(imds, fake_server, cloudwatch, monkeypatch):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", imds.url)
    monkeypatch.setenv("KEY", fake_server.api_key)
    assert main(["--url", fake_server.url, "--api-key-env", "KEY", "--group", GROUP, "--once"]) == 0
    assert {names.DIM_INSTANCE: INSTANCE} in [
        {k: v for k, v in d.items() if k == names.DIM_INSTANCE}
        for d in dimension_sets(cloudwatch, names.NAMESPACE, names.REQUESTS_PROCESSING)
    ]


def test_no_instance_id_and_no_imds_exits_2(monkeypatch, caplog):
    monkeypatch.setenv("AWS_EC2_METADATA_SERVICE_ENDPOINT", "http://127.0.0.1:9")
    assert main(["--group", GROUP, "--dry-run", "--once"]) == 2
    assert "no --instance-id and instance metadata (IMDSv2) at http://127.0.0.1:9" in caplog.text


def test_loop_scrapes_every_interval_and_stops_on_sigterm(fake_server):
    proc = subprocess.Popen(
        [sys.executable, "-m", "gguf_serve.container.metrics", "--url", fake_server.url, "--api-key-env", "K",
         "--group", GROUP,
         "--instance-id", INSTANCE, "--interval", "1", "--dry-run"],
        env={**os.environ, "PYTHONPATH": str(ROOT), "K": fake_server.api_key},
        stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while len([r for r in fake_server.requests if r[0] == "/metrics"]) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert err.count("dry run, not published") >= 3
    assert "GeneratedTokensPerSecond=0" in err  # the second scrape onwards has rates
    assert err.rstrip().endswith("stopped")
