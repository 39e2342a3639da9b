"""`up --native`: llama-server (through `gguf-serve-launch serve`), the hop and Prometheus as child processes of
this one, in the foreground: Ctrl-C or SIGTERM stops all three; any of them ending stops the others."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import yaml

from gguf_serve.container.names import API_KEY_ENV
from gguf_serve.local.process import PACKAGE_ROOT
from gguf_serve.local.workstation.prepare import Workdir, WorkstationError

OBSERVABILITY = Path(__file__).resolve().parent / "observability"  # Prometheus and Compose files, package data


def prometheus_config(work: Workdir, hop_port: int, scrape_s: float) -> Path:
    """The committed observability/prometheus.yml with the hop's address, the key file and the rules' paths of
    this machine: the same job, authorization and rules as the Compose stack."""
    config = yaml.safe_load((OBSERVABILITY / "prometheus.yml").read_text())
    config["global"] = {"scrape_interval": f"{scrape_s:g}s", "evaluation_interval": f"{scrape_s:g}s"}
    config["rule_files"] = [str(OBSERVABILITY / "rules" / Path(f).name) for f in config["rule_files"]]
    job = config["scrape_configs"][0]
    job["authorization"]["credentials_file"] = str(work.api_key_file)
    job["static_configs"] = [{"targets": [f"127.0.0.1:{hop_port}"]}]
    path = work.config / "prometheus.yml"
    path.write_text(json.dumps(config, indent=1))  # JSON is YAML
    return path


def _health(url: str) -> int | None:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as r:  # noqa: S310 - loopback
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def hop_command(port: int, server_port: int) -> list[str]:
    """The hop in front of the native llama-server, with the key from the environment both get."""
    return [sys.executable, "-m", "gguf_serve.container.hop", "--listen", f"127.0.0.1:{port}",
            "--upstream", f"http://127.0.0.1:{server_port}", "--api-key-env", API_KEY_ENV]  # fmt: skip


def run(
    work: Workdir,
    *,
    api_key: str,
    server_port: int,
    port: int,
    prometheus_port: int,
    llama_server: str | None,
    prometheus: str | None,
    scrape_s: float,
    health_timeout_s: float,
) -> int:
    binary = prometheus or shutil.which("prometheus")
    if not binary:
        raise WorkstationError("no prometheus binary on PATH: apt-get install prometheus, or pass --prometheus PATH")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(PACKAGE_ROOT), os.environ.get("PYTHONPATH")]))}
    serve = [
        sys.executable,
        "-m",
        "gguf_serve.container.launch",
        "serve",
        "--spec",
        str(work.spec),
        "--model-dir",
        str(work.models),
    ]
    if llama_server:
        serve += ["--llama-server", llama_server]
    hop = hop_command(port, server_port)
    prom = [binary, f"--config.file={prometheus_config(work, port, scrape_s)}",
            f"--storage.tsdb.path={work.prometheus}", f"--web.listen-address=127.0.0.1:{prometheus_port}"]  # fmt: skip
    children: dict[str, subprocess.Popen] = {}
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    try:
        for name, cmd, extra in (("llama-server", serve, {API_KEY_ENV: api_key}), ("hop", hop, {API_KEY_ENV: api_key}),
                                 ("prometheus", prom, {})):  # fmt: skip
            log = (work.logs / f"{name}.log").open("ab")
            children[name] = subprocess.Popen(cmd, env={**env, **extra}, stdout=log, stderr=subprocess.STDOUT)
            print(f"workstation: started {name} (pid {children[name].pid}, log {work.logs / name}.log)", flush=True)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + health_timeout_s
        while _health(url) != 200:
            if (ended := _ended(children)) or stop.is_set() or time.monotonic() > deadline:
                why = f"{ended} exited" if ended else "stopped" if stop.is_set() else "timed out"
                print(f"workstation: {why} before {url}/health answered 200; logs in {work.logs}", file=sys.stderr)
                return 1
            time.sleep(0.2)
        print(f"workstation: ready: API {url}/v1 (key in {work.api_key_file}), metrics {url}/metrics, "
              f"Prometheus http://127.0.0.1:{prometheus_port}", flush=True)  # fmt: skip
        while not stop.wait(0.5):
            if ended := _ended(children):
                print(f"workstation: {ended} exited; stopping the others (logs in {work.logs})", file=sys.stderr)
                return 1
        return 0
    finally:
        for proc in reversed(children.values()):
            if proc.poll() is None:
                proc.terminate()
        for proc in children.values():
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        print("workstation: stopped", flush=True)


def _ended(children: dict[str, subprocess.Popen]) -> str | None:
    return next((name for name, p in children.items() if p.poll() is not None), None)
