"""python -m latencyproxy: serve llama-server through the timing hop (see latencyproxy/__init__.py)."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
import threading

from catalog.names import SERVER_PORT, UPSTREAM_PORT
from latencyproxy.gpu import GpuReader
from latencyproxy.proxy import ProxyServer


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - the container's published port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m latencyproxy", description=__doc__)
    listen = ("0.0.0.0", SERVER_PORT)  # noqa: S104 - in front of llama-server, where clients connect
    p.add_argument("--listen", type=_listen, default=listen, help=f"HOST:PORT (default 0.0.0.0:{SERVER_PORT})")
    upstream = f"http://127.0.0.1:{UPSTREAM_PORT}"
    p.add_argument("--upstream", default=upstream, help="llama-server base URL (default %(default)s)")
    p.add_argument(
        "--gpu-metrics",
        choices=("auto", "off"),
        default="auto",
        help="GPU gauges from nvidia-smi on each /metrics scrape: auto (when nvidia-smi is on PATH) or off",
    )
    p.add_argument("--nvidia-smi", help="nvidia-smi binary (default: from PATH)")
    p.add_argument("--upstream-timeout", type=float, default=900.0, help="seconds without a byte from upstream")
    p.add_argument("-v", "--verbose", action="store_true", help="log every request line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s latencyproxy %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    gpu = None if args.gpu_metrics == "off" else GpuReader(args.nvidia_smi)
    try:
        server = ProxyServer(args.listen, args.upstream, gpu=gpu, upstream_timeout_s=args.upstream_timeout)
    except (ValueError, OSError) as e:
        print(f"latencyproxy: {e}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    host, port = server.server_address[:2]
    gpu_text = f"GPU gauges from {gpu.binary}" if gpu and gpu.binary else "no GPU gauges"
    logging.getLogger("latencyproxy").info("listening on %s:%s, upstream %s, %s", host, port, args.upstream, gpu_text)
    with server:
        server.serve_forever()
    return 0
