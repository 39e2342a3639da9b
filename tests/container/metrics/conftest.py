"""Fixtures for the metrics publisher: captured /metrics, a stand-in llama-server over HTTP, and moto's CloudWatch."""

from __future__ import annotations

import json
import threading
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import boto3
import pytest
from moto import mock_aws

DATA = Path(__file__).parent / "data"
REGION = "cn-northwest-1"
GROUP = "gguf-serve-fleet-asg"
INSTANCE = "i-0123456789abcdef0"

# Families and order exactly as server_task_result_metrics::to_metrics() writes them (llama-cpp-python 0.3.36)
COUNTERS = (
    "prompt_tokens_total",
    "prompt_tokens_cached_total",
    "prompt_seconds_total",
    "tokens_predicted_total",
    "tokens_predicted_seconds_total",
    "n_decode_total",
    "n_tokens_max",
    "spec_decode_num_draft_tokens_total",
    "spec_decode_num_accepted_tokens_total",
    "spec_decode_num_drafts_total",
)
GAUGES = (
    "prompt_tokens_seconds",
    "predicted_tokens_seconds",
    "requests_processing",
    "requests_deferred",
    "n_busy_slots_per_decode",
)


def captured(name: str) -> str:
    """Real /metrics answers from the llama-server built by scripts/build-llama-server.sh."""
    return (DATA / name).read_text()


def metrics_text(per_pos: list[int] | None = None, **values: float) -> str:
    """A /metrics answer in llama-server's exact layout; unnamed values are 0."""
    lines = []
    for kind, items in (("counter", COUNTERS), ("gauge", GAUGES)):
        for item in items:
            lines += [
                f"# HELP llamacpp:{item} description",
                f"# TYPE llamacpp:{item} {kind}",
                f"llamacpp:{item} {values.get(item, 0):g}",
            ]
    if per_pos:
        name = "llamacpp:spec_decode_num_accepted_tokens_per_pos_total"
        lines += [f"# HELP {name} Accepted tokens per draft position", f"# TYPE {name} counter"]
        lines += [f'{name}{{position="{i}"}} {n}' for i, n in enumerate(per_pos)]
    return "\n".join(lines) + "\n"


class FakeLlamaServer:
    """Answers /metrics and /props like llama-server with --metrics and an API key; the test sets what it says."""

    def __init__(self, api_key: str = "fake-key") -> None:
        self.api_key = api_key
        self.metrics = metrics_text()
        self.start_time = "1000"
        self.props: dict | None = {"total_slots": 4}
        self.requests: list[tuple[str, str | None]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                auth = self.headers.get("Authorization")
                fake.requests.append((self.path, auth))
                if auth != f"Bearer {fake.api_key}":
                    return self._send(401, json.dumps({"error": {"message": "Invalid API Key", "code": 401}}))
                if self.path == "/metrics":
                    return self._send(200, fake.metrics, {"Process-Start-Time-Unix": fake.start_time})
                if self.path == "/props" and fake.props is not None:
                    return self._send(200, json.dumps(fake.props))
                return self._send(404, json.dumps({"error": {"message": "File Not Found", "code": 404}}))

            def _send(self, status: int, body: str, headers: dict | None = None) -> None:
                data = body.encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake_server():
    server = FakeLlamaServer()
    yield server
    server.close()


@pytest.fixture
def cloudwatch(monkeypatch):
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN"):
        monkeypatch.setenv(var, "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    with mock_aws():
        yield boto3.client("cloudwatch", region_name=REGION)


def dimension_sets(client, namespace: str, metric: str) -> list[dict[str, str]]:
    """The distinct dimension sets published for a metric, as {name: value}, fewest dimensions first."""
    found = client.list_metrics(Namespace=namespace, MetricName=metric)["Metrics"]
    distinct = {tuple((d["Name"], d["Value"]) for d in m["Dimensions"]) for m in found}  # moto repeats per datum
    return [dict(dims) for dims in sorted(distinct, key=len)]


def datapoints(client, namespace: str, metric: str, dimensions: dict[str, str]) -> list[dict]:
    """Datapoints of one metric at one dimension set over the last hour, oldest first."""
    now = datetime.now(UTC)
    answer = client.get_metric_statistics(
        Namespace=namespace,
        MetricName=metric,
        Dimensions=[{"Name": k, "Value": v} for k, v in dimensions.items()],
        StartTime=now - timedelta(hours=1),
        EndTime=now + timedelta(minutes=5),
        Period=60,
        Statistics=["Maximum", "Minimum", "SampleCount"],
    )
    return sorted(answer["Datapoints"], key=lambda p: p["Timestamp"])
