"""`gguf-serve-launch health`: the container HEALTHCHECK, exit 0 when llama-server's /health answers 200.

Standard library and `gguf_serve.container.names` only (on SageMaker the port is the one it gave the container),
and nothing else of the launcher is imported on this path
(`__main__.py` dispatches here before `cli`): Docker runs it every 15 s with a 5 s timeout, and
with `PYTHONDONTWRITEBYTECODE` every run compiles what it imports. The full CLI (the fetcher, urllib3, the
profile code) took 0.7 s natively and about 60 s under QEMU, so the arm64 image never turned healthy there.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

from gguf_serve.container import names


def check(spec: str, timeout: float) -> int:
    port = names.SERVER_PORT  # the health check must not fail on a spec it cannot read
    with contextlib.suppress(KeyError, ValueError):  # on SageMaker: the port it gave the container
        port = int(os.environ[names.SAGEMAKER_PORT_ENV])
    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        port = int(json.loads(Path(spec).read_text())["server"]["port"])
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=timeout) as r:  # noqa: S310
            return 0 if r.status == 200 else 1
    except (OSError, urllib.error.URLError):
        return 1


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--spec", default=names.RUNTIME_SPEC_PATH)
    p.add_argument("--timeout", type=float, default=5.0)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gguf-serve-launch health", description=__doc__.split("\n")[0])
    add_arguments(p)
    args = p.parse_args(argv)
    return check(args.spec, args.timeout)
