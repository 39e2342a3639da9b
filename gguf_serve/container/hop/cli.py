"""gguf-serve-hop: serve llama-server through the timing hop (see gguf_serve/container/hop/__init__.py)."""

from __future__ import annotations

import argparse
import logging
import resource
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from gguf_serve.container.hop.auth import ApiKeys
from gguf_serve.container.hop.drain import Drainer, DrainSettings
from gguf_serve.container.hop.gpu import GpuReader
from gguf_serve.container.hop.models import ServedModels, parse_route
from gguf_serve.container.hop.pod import PodDrainer
from gguf_serve.container.hop.proxy import Admission, Limits, ProxyServer
from gguf_serve.container.names import API_KEY_ENV, SERVER_PORT, UPSTREAM_PORT

MIB = 1024 * 1024
# How a start says where the key comes from, or which gate stands in its place: the hop refuses to start without
# one (proxy.py), and every start the product writes names one (tests/stacks/test_hop_key_sources.py).
KEY_SOURCES = ("--api-key-env-file", "--api-key-env", "--no-api-key")


def _listen(text: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return host or "0.0.0.0", int(port)  # noqa: S104 - the container's published port


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-hop", description=__doc__)
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
    p.add_argument(
        "--spec",
        help="runtime spec (gguf_serve.container.spec): slots and queue_per_slot for admission control come from it",
    )
    p.add_argument(
        "--served-model",
        action="append",
        metavar="NAME",
        help="a name the model answers to (repeat; default: the --spec model's name and aliases); a request naming "
        "another model gets 404 model_not_found, GET /v1/models lists these",
    )
    p.add_argument(
        "--route",
        action="append",
        metavar="NAME=URL",
        help="a model another fleet behind the same endpoint serves, and its http:// address there (repeat): a "
        "request naming it is forwarded with X-Gateway-Model-Name: NAME, and GET /v1/models lists it",
    )
    p.add_argument("--slots", type=int, help="llama-server's slots (-np), when there is no --spec")
    p.add_argument(
        "--queue-per-slot", type=int, help="waiting requests per slot before 429 (default: the spec's, else none)"
    )
    limits = Limits()
    p.add_argument(
        "--max-body-mib", type=float, default=limits.max_body_bytes / MIB, help="413 above (default %(default)s)"
    )
    p.add_argument(
        "--idle-timeout", type=float, default=limits.idle_timeout_s, help="keep-alive s (default %(default)s)"
    )
    p.add_argument("--header-timeout", type=float, default=limits.header_timeout_s, help="s (default %(default)s)")
    p.add_argument("--body-timeout", type=float, default=limits.body_timeout_s, help="s between body pieces")
    p.add_argument(
        "--body-deadline", type=float, default=limits.body_deadline_s, help="s for a whole body (default %(default)s)"
    )
    p.add_argument("--max-connections", type=int, default=limits.max_connections, help="default %(default)s")
    key = p.add_argument_group(  # KEY_SOURCES: one of them on every start (tests/stacks/test_hop_key_sources.py)
        "API key", "llama-server's key: a request without it is answered 401 here, never read, forwarded or admitted"
    )
    key_file, key_env, no_key = KEY_SOURCES
    key.add_argument(
        key_file, type=Path, help=f"file with a line {API_KEY_ENV}=... (the instance's; re-read on change)"
    )
    key.add_argument(key_env, metavar="NAME", help=f"environment variable holding the key, e.g. {API_KEY_ENV}")
    key.add_argument(
        no_key,
        metavar="GATE",
        default="",
        help="check no key here, because GATE stands in front (named in the log); without a key source or this, the "
        "hop refuses to start",
    )
    drain = p.add_argument_group(
        "drain", "watch the instance metadata and drain on a notice (gguf_serve/container/hop/drain.py)"
    )
    drain.add_argument("--drain-imds", metavar="URL", help="IMDS base URL, e.g. http://169.254.169.254 (off without)")
    drain.add_argument(
        "--drain-deadline", type=float, default=DrainSettings.deadline_s, help="s a lifecycle drain waits for streams"
    )
    drain.add_argument("--drain-hook", help="termination lifecycle hook to heartbeat and complete (none without)")
    drain.add_argument("--region", help="AWS region for the lifecycle calls and the drain's metrics")
    drain.add_argument("--namespace", help="CloudWatch namespace for the drain's counts (log only without)")
    drain.add_argument(
        "--pod-drain",
        metavar="FILE",
        type=Path,
        help="in a Kubernetes pod: drain on SIGUSR1 (the preStop hook, gguf_serve/container/hop/pod.py) up to "
        "--drain-deadline, then write the outcome to FILE; instead of --drain-imds",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="log every request line")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s gguf-serve-hop %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    gpu = None if args.gpu_metrics == "off" else GpuReader(args.nvidia_smi)
    limits = Limits(
        max_body_bytes=int(args.max_body_mib * MIB),
        idle_timeout_s=args.idle_timeout,
        header_timeout_s=args.header_timeout,
        body_timeout_s=args.body_timeout,
        body_deadline_s=args.body_deadline,
        max_connections=args.max_connections,
    )
    _raise_open_files(limits.max_connections + limits.overflow_connections)
    try:
        admission = _admission(args)
        keys = _keys(args)
        drainer = None
        if args.pod_drain and args.drain_imds:
            raise ValueError("--pod-drain and --drain-imds: a pod has no instance metadata to watch; use one")
        if args.pod_drain:
            drainer = PodDrainer(deadline_s=args.drain_deadline, report=args.pod_drain)
            drainer.install()
        elif args.drain_imds:
            drainer = Drainer(
                DrainSettings(
                    imds_url=args.drain_imds,
                    deadline_s=args.drain_deadline,
                    hook=args.drain_hook,
                    region=args.region,
                    namespace=args.namespace,
                )
            )
        server = ProxyServer(
            args.listen,
            args.upstream,
            gpu=gpu,
            upstream_timeout_s=args.upstream_timeout,
            limits=limits,
            admission=admission,
            drainer=drainer,
            keys=keys,
            gate=args.no_api_key,
            models=_models(args),
        )
    except (ValueError, OSError) as e:
        print(f"gguf-serve-hop: {e}", file=sys.stderr)
        return 2
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: threading.Thread(target=server.shutdown, daemon=True).start())
    host, port = server.server_address[:2]
    gpu_text = f"GPU gauges from {gpu.binary}" if gpu and gpu.binary else "no GPU gauges"
    shed = f"429 past {admission.limit} in flight" if admission.limit else "no admission limit"
    watch = (
        f"drain on SIGUSR1 (outcome in {args.pod_drain})"
        if args.pod_drain
        else f"drain on IMDS notices ({args.drain_imds})"
        if drainer
        else "no drain watch"
    )
    auth = "401 without the API key" if keys else f"NO API KEY CHECKED HERE: the gate is {server.gate}"
    logging.getLogger("gguf-serve-hop").info(
        "listening on %s:%s, upstream %s, %s, %s, %s, %s", host, port, args.upstream, gpu_text, shed, auth, watch
    )
    with server:
        server.serve_forever()
    return 0


def _spec(args: argparse.Namespace) -> Any:
    from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError

    try:
        return RuntimeSpec.load(args.spec)
    except RuntimeSpecError as e:
        raise ValueError(str(e)) from None


def _models(args: argparse.Namespace) -> ServedModels | None:
    """The names this endpoint serves: --served-model, else the spec's model and its aliases; none: no check. With
    --route, the models other fleets behind the same endpoint serve."""
    routes = tuple(parse_route(r) for r in args.route or ())
    names = tuple(args.served_model or ()) or (_spec(args).model.served_names if args.spec else ())
    if not names:
        if routes:
            raise ValueError("--route needs the names served here: --spec or --served-model")
        return None
    return ServedModels(names, routes)


def _admission(args: argparse.Namespace) -> Admission:
    slots, queue = args.slots, args.queue_per_slot
    if args.spec:
        spec = _spec(args)
        slots = slots or spec.server.parallel
        queue = spec.server.queue_per_slot if queue is None else queue
    if (slots is not None and slots < 1) or (queue is not None and queue < 0):
        raise ValueError(f"--slots must be at least 1 and --queue-per-slot at least 0, got {slots} and {queue}")
    return Admission(slots=slots or 1, queue_per_slot=queue)


def _keys(args: argparse.Namespace) -> ApiKeys | None:
    if args.api_key_env_file and args.api_key_env:
        raise ValueError("give the API key one way: --api-key-env-file or --api-key-env")
    if args.no_api_key and (args.api_key_env_file or args.api_key_env):
        raise ValueError("--no-api-key with a key source: give one or the other")
    if args.api_key_env_file:
        return ApiKeys(env_file=args.api_key_env_file)
    return ApiKeys.from_env(args.api_key_env) if args.api_key_env else None


def _raise_open_files(connections: int) -> None:
    """Room for every client connection and its upstream one (two descriptors: upstream.py keeps a second to read
    an answer left unread by a reset), and a burst of accepts: the soft limit up to the hard one (asyncio accepts up
    to 100 connections per wake-up before a closed one's socket is released)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = 3 * connections + 100 + 64
    if soft != resource.RLIM_INFINITY and soft < want:
        target = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
