"""`gguf-serve-workstation check|up|down`: serve a catalog workstation profile on this machine."""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.loader import LOCK_NAME, PROFILES_DIR, Catalog, load_catalog
from gguf_serve.catalog.profiles import ServingProfile
from gguf_serve.container.names import SERVER_PORT
from gguf_serve.local.process import port_taken
from gguf_serve.local.workstation import compose, native
from gguf_serve.local.workstation.plan import card_table, profile_lines
from gguf_serve.local.workstation.prepare import Workdir, WorkstationError, check_card, fetch, write_config

TABLE_MODELS = ["Qwen3.6-27B", "Qwen3.6-35B-A3B"]


def _catalog(args: argparse.Namespace) -> Catalog:
    return load_catalog(args.profiles, lock_file=args.lock_file or args.profiles / LOCK_NAME)


def _profile(catalog: Catalog, name: str) -> ServingProfile:
    if name not in catalog.workstation_profiles:
        known = ", ".join(sorted(catalog.workstation_profiles)) or "none"
        raise WorkstationError(f"no workstation profile {name!r} in {catalog.root / 'workstation'} (known: {known})")
    return catalog.workstation_profiles[name]


def check(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    models = [m for m in TABLE_MODELS if m in catalog.models]
    print("\n".join(card_table(catalog, models)))
    print("\n".join(["", *profile_lines(catalog)]))
    print(f"{len(catalog.workstation_profiles)} workstation profiles valid ({catalog.root / 'workstation'})")
    return 0


def up(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    profile = _profile(catalog, args.profile)
    if args.cpu and not args.native:
        raise WorkstationError("--cpu runs llama-server on this machine's CPU: it needs --native")
    work = Workdir(args.work_dir) if args.work_dir else Workdir.default(profile.name)
    if args.cpu:
        profile = profile.with_server(gpu_layers=0, n_cpu_moe=0)
    elif not args.skip_gpu_check:
        check_card(profile)
    if args.native:
        server_port = args.server_port or args.port + 1
        ports = {"--port (the hop)": args.port, "--server-port (llama-server; default --port + 1)": server_port,
                 "--prometheus-port": args.prometheus_port}  # fmt: skip
        if len(set(ports.values())) < len(ports):
            raise WorkstationError(f"the hop, llama-server and Prometheus need three different ports: {ports}")
        for option, port in ports.items():
            if port_taken(port):
                raise WorkstationError(f"127.0.0.1:{port} is in use: choose another {option}")
        profile = profile.with_server(host="127.0.0.1", port=server_port)
    else:
        profile = profile.with_server(host="0.0.0.0", port=SERVER_PORT)  # noqa: S104 - inside the container
        compose.check_docker(args.image)
    s = profile.server
    print(f"workstation: {profile.name}: {profile.model.name} on {profile.hardware.gpu if s.gpu_layers else 'the CPU'}"
          f", {s.parallel} x {s.ctx_per_slot} ctx, MTP {'on' if profile.mtp else 'off'}"
          f"{f', --n-cpu-moe {s.n_cpu_moe}' if s.n_cpu_moe else ''}; files in {work.root}", flush=True)  # fmt: skip
    if not profile.model.sha256:
        print(f"workstation: {profile.model.name} has no pinned sha256: checked against the listing only "
              f"(gguf-serve-catalog lock {profile.model.name} pins it)", flush=True)  # fmt: skip
    key = write_config(profile, work)
    if not args.skip_fetch:
        fetch(work, args.endpoint)
    if args.native:
        return native.run(work, api_key=key, server_port=profile.server.port, port=args.port,
                          prometheus_port=args.prometheus_port, llama_server=args.llama_server,
                          prometheus=args.prometheus, scrape_s=args.scrape_interval,
                          health_timeout_s=args.health_timeout)  # fmt: skip
    env = compose.environment(work, image=args.image, port=args.port, prometheus_port=args.prometheus_port)
    if compose.compose(["up", "-d"], env) != 0:
        raise WorkstationError("docker compose up failed (its output is above)")
    return _wait_compose(f"http://127.0.0.1:{args.port}", work, args.health_timeout)


def _wait_compose(url: str, work: Workdir, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as r:  # noqa: S310 - loopback
                if r.status == 200:
                    print(f"workstation: ready: API {url}/v1 (key in {work.api_key_file}), Prometheus on "
                          "127.0.0.1:9090 unless PROMETHEUS_PORT; `gguf-serve-workstation down` stops it")  # fmt: skip
                    return 0
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(2)
    print(f"workstation: {url}/health not 200 after {timeout:.0f} s: docker compose logs server", file=sys.stderr)
    return 1


def down(args: argparse.Namespace) -> int:
    catalog = _catalog(args)
    profile = _profile(catalog, args.profile)
    work = Workdir(args.work_dir) if args.work_dir else Workdir.default(profile.name)
    env = compose.environment(work, image=args.image, port=args.port, prometheus_port=args.prometheus_port)
    return compose.compose(["down"], env)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-workstation", description=__doc__)
    p.add_argument("--profiles", type=Path, default=PROFILES_DIR, help="the profile folder (default: profiles/)")
    p.add_argument("--lock-file", type=Path, help=f"default: <profiles>/{LOCK_NAME}")
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("check", help="the memory plan per card and model, and every workstation profile").set_defaults(
        func=check
    )
    for name, func, text in (("up", up, "fetch the model and start server, hop and Prometheus"),
                             ("down", down, "stop the Compose stack")):  # fmt: skip
        c = sub.add_parser(name, help=text)
        c.add_argument(
            "profile",
            help="a profile of profiles/workstation/ (gguf-serve-workstation check lists them)",
        )
        c.add_argument("--work-dir", type=Path, help="config, model, Prometheus data, logs (default: the cache)")
        c.add_argument("--image", default=compose.DEFAULT_IMAGE, help="the CUDA serving image (default %(default)s)")
        c.add_argument("--port", type=int, default=SERVER_PORT, help="the API through the hop, on 127.0.0.1")
        c.add_argument("--prometheus-port", type=int, default=9090)
        c.set_defaults(func=func)
        if name == "down":
            continue
        c.add_argument("--native", action="store_true", help="processes instead of Docker (llama-server, Prometheus)")
        c.add_argument("--cpu", action="store_true", help="with --native: no GPU layers (a machine without a GPU)")
        c.add_argument("--endpoint", help="ModelScope endpoint or mirror (default: MODELSCOPE_ENDPOINT, modelscope.cn)")
        c.add_argument("--skip-fetch", action="store_true", help="the model is already in <work-dir>/models")
        c.add_argument("--skip-gpu-check", action="store_true", help="do not compare nvidia-smi with the card")
        c.add_argument("--llama-server", help="with --native: the binary (default /usr/local/bin, then PATH)")
        c.add_argument("--prometheus", help="with --native: the binary (default: PATH)")
        c.add_argument("--server-port", type=int, help="with --native: llama-server's port (default --port + 1)")
        c.add_argument("--scrape-interval", type=float, default=15.0, help="with --native: seconds (default 15)")
        c.add_argument("--health-timeout", type=float, default=900.0, help="seconds to wait for /health 200")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        return args.func(args)
    except (ProfileError, WorkstationError) as e:
        print(f"workstation: {e}", file=sys.stderr)
        return 1
