"""gguf-serve-metrics: publish llama-server's /metrics to CloudWatch every --interval seconds."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading
import time
import urllib.parse
from pathlib import Path

from gguf_serve.container.metrics import names
from gguf_serve.container.metrics.publish import Publisher
from gguf_serve.container.metrics.scrape import ApiKeySource, ScrapeError, instance_id_from_imds

log = logging.getLogger("gguf-serve-metrics")


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _url(text: str) -> str:
    parts = urllib.parse.urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise argparse.ArgumentTypeError(f"expected http(s)://host:port, got {text!r}")
    return text.rstrip("/")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-metrics", description=__doc__)
    p.add_argument("--url", type=_url, default="http://127.0.0.1:8080", help="llama-server base URL")
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key-env-file", type=Path, help="file with a line LLAMA_API_KEY=... (re-read each scrape)")
    key.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the API key")
    p.add_argument("--namespace", default=names.NAMESPACE, help="CloudWatch namespace (default %(default)s)")
    p.add_argument("--group", required=True, help="Auto Scaling group name (the AutoScalingGroupName dimension)")
    p.add_argument("--instance-id", help="InstanceId dimension (default: from instance metadata, IMDSv2)")
    p.add_argument("--region", help="CloudWatch region, e.g. cn-northwest-1 (default: the SDK's)")
    p.add_argument("--interval", type=_positive_int, default=60, help="seconds between scrapes (default 60)")
    p.add_argument("--slots", type=_positive_int, help="the server's slot count (default: total_slots from /props)")
    p.add_argument("--timeout", type=float, default=10.0, help="HTTP timeout in seconds (default 10)")
    p.add_argument("--once", action="store_true", help="scrape and publish once, then exit (gauges only)")
    p.add_argument("--dry-run", action="store_true", help="log the values instead of publishing them")
    p.add_argument("-v", "--verbose", action="store_true", help="log every publication")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s gguf-serve-metrics %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("botocore").setLevel(logging.WARNING)
    if not args.group.strip():
        log.error("--group must not be empty")
        return 2

    instance_id = args.instance_id
    if not instance_id:
        try:
            instance_id = instance_id_from_imds()
        except ScrapeError as e:
            log.error("no --instance-id and %s", e)
            return 2

    cloudwatch = None
    if not args.dry_run:
        import boto3

        cloudwatch = boto3.client("cloudwatch", region_name=args.region)

    publisher = Publisher(
        cloudwatch=cloudwatch,
        namespace=args.namespace,
        group=args.group,
        instance_id=instance_id,
        base_url=args.url,
        api_key=ApiKeySource(env_file=args.api_key_env_file, env_name=args.api_key_env),
        slots=args.slots,
        timeout_s=args.timeout,
        dry_run=args.dry_run,
    )
    log.info(
        "publishing %s to %s as %s=%s %s=%s every %ss",
        args.url, args.namespace, names.DIM_GROUP, args.group, names.DIM_INSTANCE, instance_id, args.interval,
    )  # fmt: skip
    if args.once:
        publisher.step()
        return 0
    run_forever(publisher, args.interval)
    return 0


def run_forever(publisher: Publisher, interval: int) -> None:
    stop = threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: stop.set())
    next_at = time.monotonic()
    while not stop.is_set():
        try:
            publisher.step()
        except Exception as e:  # noqa: BLE001 - this loop never stops; a surprise is one log line, then the next scrape
            log.warning("publishing cycle failed: %s: %s", type(e).__name__, e)
        next_at += interval
        stop.wait(max(0.0, next_at - time.monotonic()))
    log.info("stopped")
