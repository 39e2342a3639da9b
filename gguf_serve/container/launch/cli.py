"""`gguf-serve-launch serve|fetch|health`: the container's entry point."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from gguf_serve.container import names
from gguf_serve.container.fetch.cli import add_network_options, network_policies, positive_int
from gguf_serve.container.launch import health as launcher_health
from gguf_serve.container.launch.cpu import amx_plan
from gguf_serve.container.launch.preflight import EX_CONFIG, LaunchRefused, check_gpu, check_model
from gguf_serve.container.launch.serve import describe, exec_server, resolve_binary, server_command, server_environment
from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError

DEFAULT_SPEC = names.RUNTIME_SPEC_PATH
DEFAULT_MODEL_DIR = names.CONTAINER_MODEL_DIR


def load_spec(path: str) -> RuntimeSpec:
    """The runtime spec, or a refusal in one line (systemd does not restart a refusal)."""
    try:
        return RuntimeSpec.load(path)
    except RuntimeSpecError as e:
        raise LaunchRefused(str(e)) from e


def serve(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec)
    model_path = check_model(spec, args.model_dir)
    check_gpu(spec)
    binary = resolve_binary(args.llama_server)
    env, ignored, withheld = server_environment(os.environ, require_api_key=not args.no_api_key)
    if ignored:
        print(
            f"gguf-serve-launch: ignoring inherited {', '.join(ignored)} (the runtime spec sets every flag)", flush=True
        )
    if withheld:
        print(f"gguf-serve-launch: not passed to llama-server: {', '.join(withheld)}", flush=True)
    amx = amx_plan()  # probed in a child process: cpuid alone is not trusted
    print(f"gguf-serve-launch: {amx.line}", flush=True)
    command = server_command(spec, model_path, binary, benchmark=args.benchmark, amx=amx)
    print(describe(spec, command), flush=True)
    exec_server(command, env)
    return 0  # not reached


def fetch(args: argparse.Namespace) -> int:
    """Exit 0 with the model in place, 1 with one line saying what failed (systemd and cloud-init show it)."""
    from gguf_serve.container.fetch import FetchError, FileSpec, fetch_file

    spec = load_spec(args.spec)
    retry, rate = network_policies(args)
    try:
        result = fetch_file(
            FileSpec.from_artifact(spec.model),
            Path(args.model_dir),
            endpoint=args.endpoint,
            s3_cache=args.s3_cache,
            connections=args.connections,
            retry=retry,
            rate=rate,
        )
    except FetchError as e:
        return _fetch_failed(str(e))
    except OSError as e:
        return _fetch_failed(f"{e.strerror or type(e).__name__}{f': {e.filename}' if e.filename else ''}")
    except KeyboardInterrupt:
        return _fetch_failed("interrupted; run the same command again to resume", code=130)
    print(f"gguf-serve-launch: model ready at {result.path} ({_fetch_figures(result)})", flush=True)
    return 0


def _fetch_figures(r: Any) -> str:
    """Where the boot's model step went: the network, the hash after the last byte, the write after the hash."""
    if r.source == "local":
        return f"{r.size} bytes already verified on disk, {r.seconds:.1f} s"
    return (
        f"{r.transferred} bytes from {r.source} in {r.seconds:.1f} s: last byte at {r.received_s:.1f} s, "
        f"hashed at {r.verified_s:.1f} s, on disk at {r.seconds:.1f} s"
    )


def _fetch_failed(reason: str, code: int = 1) -> int:
    print(f"gguf-serve-launch: fetch failed: {reason}", file=sys.stderr, flush=True)
    return code


def health(args: argparse.Namespace) -> int:
    return launcher_health.check(args.spec, args.timeout)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-launch", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    s = sub.add_parser("serve", help="check the model against the runtime spec, then exec llama-server")
    s.add_argument("--spec", default=DEFAULT_SPEC, help=f"default {DEFAULT_SPEC}")
    s.add_argument("--model-dir", default=DEFAULT_MODEL_DIR, help=f"where the GGUF is (default {DEFAULT_MODEL_DIR})")
    s.add_argument("--benchmark", action="store_true", help="benchmark settings: prompt cache off")
    s.add_argument("--llama-server", help="llama-server binary (default /usr/local/bin/llama-server, then PATH)")
    s.add_argument("--no-api-key", action="store_true", help="allow serving without LLAMA_API_KEY (local dev)")
    s.set_defaults(func=serve)

    f = sub.add_parser("fetch", help="download and verify the spec's GGUF (S3 cache first, then ModelScope)")
    f.add_argument("--spec", default=DEFAULT_SPEC)
    f.add_argument("--model-dir", default=DEFAULT_MODEL_DIR)
    f.add_argument("--s3-cache", help="s3://bucket/prefix of the in-region model cache")
    f.add_argument("--endpoint", help="ModelScope base URL (default: MODELSCOPE_ENDPOINT, else modelfetch's default)")
    f.add_argument("--connections", type=positive_int, default=8, help="parallel ranged connections (default 8)")
    add_network_options(f)
    f.set_defaults(func=fetch)

    h = sub.add_parser("health", help="exit 0 when llama-server's /health answers 200 (container HEALTHCHECK)")
    launcher_health.add_arguments(h)
    h.set_defaults(func=health)
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except LaunchRefused as e:
        print(f"gguf-serve-launch: refusing to start: {e}", file=sys.stderr, flush=True)
        return EX_CONFIG
