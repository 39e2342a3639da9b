"""gguf-serve-hub --root DIR --port N: serve DIR/<owner>/<repo>/<files> with ModelScope's API."""

from __future__ import annotations

import argparse
import contextlib
import sys

from gguf_serve.local.hub.server import Faults, LocalScope


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gguf-serve-hub", description=__doc__)
    ap.add_argument("--root", required=True, help="directory holding <owner>/<repo>/<files>")
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed on start)")
    ap.add_argument("--bandwidth-mbps", type=float, default=None, help="per-connection cap in MB/s (10^6 bytes)")
    ap.add_argument("--fail-every", type=int, default=0, help="answer every Nth download with 503")
    ap.add_argument("--reset-every", type=int, default=0, help="reset every Nth download mid-body")
    ap.add_argument("--corrupt-offset", type=int, default=None, help="flip the byte at this file offset once")
    ap.add_argument("--token", default=None, help="require this access token (401 otherwise)")
    ap.add_argument("--redirect-to", default=None, help="answer downloads with 302 to signed URLs on this base URL")
    a = ap.parse_args(argv)
    faults = Faults(
        bandwidth_bps=a.bandwidth_mbps * 1e6 if a.bandwidth_mbps else None,
        fail_every=a.fail_every,
        reset_every=a.reset_every,
        corrupt_offset=a.corrupt_offset,
        token=a.token,
        redirect_to=a.redirect_to,
    )
    hub = LocalScope(a.root, host=a.host, port=a.port, faults=faults)
    print(f"gguf-serve-hub serving {a.root} at {hub.url} (MODELSCOPE_ENDPOINT={hub.url})", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        hub.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
