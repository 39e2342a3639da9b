"""`gguf-serve-bench run --sagemaker-endpoint`: the benchmark through botocore's SigV4 and event-stream parser,
against a local SageMaker Runtime (sagemaker_runtime.py) in front of a scripted container that answers as the image's
SageMaker front does (the real front and llama-server: tests/container/sagemaker/test_real_server.py)."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from gguf_serve.local.bench import cli, runner
from gguf_serve.local.bench.sagemaker import fold, make_sagemaker_client, sse_events
from tests.local.bench.sagemaker_runtime import ACCESS_KEY, SECRET_KEY, Runtime, random_split

REGION = "cn-northwest-1"
TEXT = "新能源汽车的优点：环保、省钱。缺点：续航焦虑，充电慢。"
TIMINGS = {"prompt_n": 30, "prompt_ms": 120.0, "prompt_per_second": 250.0, "predicted_n": 28, "predicted_ms": 700.0,
           "predicted_per_second": 40.0}  # fmt: skip


def _chunks(text: str) -> list[bytes]:
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "Qwen3.6-35B-A3B"}
    events = [{**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]}]
    events += [{**base, "choices": [{"index": 0, "delta": {"content": c}}]} for c in text]
    events.append({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "timings": TIMINGS})
    events.append({**base, "choices": [], "usage": {"prompt_tokens": 30, "completion_tokens": 28, "total_tokens": 58}})
    data = [b"data: " + json.dumps(e, ensure_ascii=False).encode() + b"\n\n" for e in events]
    return [*data, b"data: [DONE]\n\n"]


class _Container(BaseHTTPRequestHandler):
    """The SageMaker front's answers: a chat stream, the model list by route, a cut stream on request."""

    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
        self.server.seen.append({"body": body, "headers": dict(self.headers)})  # type: ignore[attr-defined]
        if "route=/v1/models" in self.headers.get("X-Amzn-SageMaker-Custom-Attributes", ""):
            data = json.dumps({"object": "list", "data": [{"id": "Qwen3.6-35B-A3B", "object": "model"}]}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
            return
        if body.get("max_tokens") == 1:  # the stand-in for a model error: 503 while draining
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        chunks = _chunks(TEXT)
        if body.get("max_tokens") == 2:  # cut mid-stream, as a SIGKILL would
            chunks = chunks[:5]
        for c in chunks:
            self.wfile.write(b"%x\r\n%b\r\n" % (len(c), c))
        if body.get("max_tokens") != 2:
            self.wfile.write(b"0\r\n\r\n")
        self.close_connection = True


@pytest.fixture
def runtime(monkeypatch):
    container = ThreadingHTTPServer(("127.0.0.1", 0), _Container)
    container.seen = []  # type: ignore[attr-defined]
    container.daemon_threads = True
    threading.Thread(target=container.serve_forever, args=(0.05,), daemon=True).start()
    server = Runtime(f"http://127.0.0.1:{container.server_address[1]}", "gguf-serve-graviton-moe", REGION,
                     random_split(largest=7)).start()  # fmt: skip
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_ENDPOINT_URL_SAGEMAKER_RUNTIME", server.url)
    yield server, container
    server.shutdown()
    container.shutdown()


def test_a_non_streamed_request_is_streamed_and_folded_back_whatever_the_split(runtime):
    server, container = runtime
    client = make_sagemaker_client("gguf-serve-graviton-moe", region=REGION, timeout=30)
    row = runner.single_request(client, "Qwen3.6-35B-A3B", 64)
    assert row["completion_tokens"] == 28 and row["finish_reason"] == "length" and row["timings"] == TIMINGS
    assert container.seen[-1]["body"]["stream"] is True  # sent streamed: InvokeEndpoint's 60 s would cut it
    assert server.seen[-1]["action"] == "invocations-response-stream" and server.seen[-1]["signed"]
    assert "Authorization" not in container.seen[-1]["headers"]  # IAM at SageMaker, nothing reaches the container


def test_a_streamed_request_measures_ttft_through_the_event_stream(runtime):
    client = make_sagemaker_client("gguf-serve-graviton-moe", region=REGION, timeout=30)
    row = runner.streaming_request(client, "Qwen3.6-35B-A3B", 64)
    assert row["usage_seen"] and row["completion_tokens"] == 28 and row["ttft_s"] is not None


def test_folding_reassembles_utf8_split_inside_a_character():
    data = b"".join(_chunks(TEXT))
    parts = [data[i : i + 1] for i in range(len(data))]  # every byte its own part
    answer = fold(sse_events(parts))
    assert answer["choices"][0]["message"]["content"] == TEXT and answer["usage"]["completion_tokens"] == 28


def test_errors_are_recorded_rows_not_tracebacks(runtime):
    client = make_sagemaker_client("gguf-serve-graviton-moe", region=REGION, timeout=30)
    refused = runner.attempt(lambda: runner.single_request(client, "m", 1), streamed=False)
    assert "ModelError" in refused["error"] and "503" in refused["error"]
    cut = runner.attempt(lambda: runner.streaming_request(client, "m", 2), streamed=True)
    assert "ModelStreamError" in cut["error"] or "cut short" in cut["error"]
    missing = make_sagemaker_client("no-such-endpoint", region=REGION, timeout=30)
    gone = runner.attempt(lambda: runner.single_request(missing, "m", 8), streamed=False)
    assert "ValidationError" in gone["error"] and "not found" in gone["error"]


def test_the_cli_runs_the_reports_method_and_prices_the_ml_type(runtime, tmp_path, capsys):
    out = tmp_path / "run.json"
    argv = ["run", "--sagemaker-endpoint", "gguf-serve-graviton-moe", "--region", REGION, "--profile",
            "graviton-moe", "--max-tokens", "64", "--repetitions", "2", "--warmup", "0", "-o", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    doc = json.loads(out.read_text())
    assert doc["instance_type"] == "ml.c8g.4xlarge" and doc["endpoint"] == "sagemaker:gguf-serve-graviton-moe"
    assert doc["served_model"] == "Qwen3.6-35B-A3B" and doc["complete"] and len(doc["runs"]) == 2
    capsys.readouterr()
    assert cli.main(["cost", str(out)]) == 0
    table = capsys.readouterr().out
    line = next(row for row in table.splitlines() if row.startswith("| ml.c8g.4xlarge"))
    assert "on-demand" in line and "~¥" in line  # the ml type's own price, marked as the estimate it is
    assert cli.main(["report", str(out)]) == 0
    assert "ml.c8g.4xlarge" in capsys.readouterr().out
