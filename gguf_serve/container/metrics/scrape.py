"""HTTP reads: llama-server's /metrics and /props with the API key, the API key itself, and the instance id."""

from __future__ import annotations

import http.client
import json
import os
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gguf_serve.container.metrics.prometheus import MetricFamily, parse_prometheus

IMDS_ENDPOINT = "http://169.254.169.254"
START_TIME_HEADER = "Process-Start-Time-Unix"  # changes when llama-server restarts
MAX_BODY = 4 * 1024 * 1024  # llama-server's /metrics is a few KB; more is not llama-server


class ScrapeError(Exception):
    """A scrape that produced no metrics; the message is one line fit for the log."""


@dataclass(frozen=True)
class ApiKeySource:
    """Where the API key lives; read on every scrape so that a rotated key is picked up."""

    env_file: Path | None = None
    env_name: str | None = None
    file_variable: str = "LLAMA_API_KEY"

    def read(self) -> str | None:
        if self.env_name:
            value = os.environ.get(self.env_name)
            if not value:
                raise ScrapeError(f"API key variable {self.env_name} is not set")
            return value
        if self.env_file:
            try:
                text = self.env_file.read_text()
            except OSError as e:
                raise ScrapeError(f"cannot read API key file {self.env_file}: {e.strerror}") from None
            value = read_env_file(text).get(self.file_variable)
            if not value:
                raise ScrapeError(f"API key file {self.env_file} has no {self.file_variable}=")
            return value
        return None


def read_env_file(text: str) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile and docker --env-file write them (optional quotes, export)."""
    out: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, value = line.split("=", 1)
        key = key.strip().removeprefix("export ").strip()
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        out[key] = value
    return out


@dataclass(frozen=True)
class ServerScrape:
    families: dict[str, MetricFamily]
    start_time: str | None  # the Process-Start-Time-Unix header: an identity of the server process


def _get(url: str, api_key: str | None, timeout: float) -> tuple[bytes, dict[str, str]]:
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    request = urllib.request.Request(url, headers=headers)  # noqa: S310 (the URL is the operator's --url)
    deadline = time.monotonic() + timeout
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:  # noqa: S310
            return read_body(response, url, deadline, timeout), dict(response.headers)
    except urllib.error.HTTPError as e:
        raise ScrapeError(f"GET {url}: HTTP {e.code} {_error_message(e)}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise ScrapeError(f"GET {url}: {reason}") from None
    except http.client.HTTPException as e:  # a truncated body, or a reply that is not HTTP
        raise ScrapeError(f"GET {url}: broken HTTP answer ({type(e).__name__})") from None


def read_body(response: Any, url: str, deadline: float, timeout: float, limit: int = MAX_BODY) -> bytes:
    """The whole body, within `limit` bytes and by `deadline` (so at least limit/timeout bytes per second)."""
    parts: list[bytes] = []
    total = 0
    while chunk := response.read1(65536):
        total += len(chunk)
        if total > limit:
            raise ScrapeError(f"GET {url}: body larger than {limit // (1024 * 1024)} MiB; not llama-server's answer")
        if time.monotonic() > deadline:
            raise ScrapeError(
                f"GET {url}: {urlsplit(url).netloc} sent {total:,} bytes in {timeout:g} s "
                f"({total / timeout:,.0f} B/s), too slow for the {timeout:g} s deadline"
            )
        parts.append(chunk)
    expected = (response.headers.get("Content-Length") or "").strip()
    if expected.isdigit() and int(expected) != total:  # read1 reports a connection closed early as a plain end
        raise ScrapeError(f"GET {url}: body cut short ({total:,} of {int(expected):,} bytes)")
    return b"".join(parts)


def _error_message(e: urllib.error.HTTPError) -> str:
    try:
        body = e.read(4096).decode("utf-8", "replace")
        return str(json.loads(body)["error"]["message"])
    except Exception:
        return e.reason or ""


def scrape_metrics(base_url: str, api_key: str | None, timeout: float = 10.0) -> ServerScrape:
    body, headers = _get(base_url.rstrip("/") + "/metrics", api_key, timeout)
    try:
        families = parse_prometheus(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise ScrapeError(f"GET {base_url}/metrics: unparseable answer: {e}") from None
    return ServerScrape(families, headers.get(START_TIME_HEADER))


def fetch_total_slots(base_url: str, api_key: str | None, timeout: float = 10.0) -> int:
    """The server's slot count (-np) from GET /props."""
    body, _ = _get(base_url.rstrip("/") + "/props", api_key, timeout)
    try:
        slots = json.loads(body)["total_slots"]
    except (ValueError, KeyError, TypeError) as e:
        raise ScrapeError(f"GET {base_url}/props: no total_slots ({e})") from None
    if not isinstance(slots, int) or slots < 1:
        raise ScrapeError(f"GET {base_url}/props: bad total_slots {slots!r}")
    return slots


def instance_id_from_imds(endpoint: str | None = None, timeout: float = 2.0) -> str:
    """The instance id through IMDSv2 (session token first). In a bridged container the hop limit must be >= 2."""
    base = (endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or IMDS_ENDPOINT).rstrip("/")
    try:
        put = urllib.request.Request(  # noqa: S310 (link-local metadata service)
            base + "/latest/api/token", method="PUT", headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"}
        )
        with urllib.request.urlopen(put, timeout=timeout) as response:  # noqa: S310
            token = read_body(response, base, time.monotonic() + timeout, timeout, limit=4096).decode()
        get = urllib.request.Request(  # noqa: S310
            base + "/latest/meta-data/instance-id", headers={"X-aws-ec2-metadata-token": token}
        )
        with urllib.request.urlopen(get, timeout=timeout) as response:  # noqa: S310
            instance_id = read_body(response, base, time.monotonic() + timeout, timeout, limit=4096).decode().strip()
    except (urllib.error.URLError, OSError, http.client.HTTPException, UnicodeDecodeError) as e:
        raise ScrapeError(f"instance metadata (IMDSv2) at {base}: {getattr(e, 'reason', e)}") from None
    if not instance_id.startswith("i-"):
        raise ScrapeError(f"instance metadata (IMDSv2) at {base}: unexpected instance id {instance_id!r}")
    return instance_id
