"""`docker run <image> serve` on SageMaker: the front at once, the model checked, llama-server behind the front.

1. The front (front.py) binds SAGEMAKER_BIND_TO_PORT (else 8080) first: SageMaker's pings start at once and must
   connect within 250 ms; /ping answers 503 until llama-server has loaded the model.
2. The one GGUF under /opt/ml/model is checked against the runtime spec (model.py): refused with why, exit 78.
3. llama-server starts as a child on a loopback port (from SAGEMAKER_SAFE_PORT_RANGE when given) with the
   catalog's flags; no API key: IAM is the gate (InvokeEndpoint is SigV4-signed) and nothing else reaches it.
4. Metrics go to CloudWatch through stdout (emf.py) every minute.
5. SIGTERM: new requests get 503, streams run until SIGKILL_AFTER_S - DRAIN_MARGIN_S after the signal; what still
   runs then is cut and counted (a log line and an EMF line), llama-server is stopped, exit 0. A llama-server that
   dies on its own ends the container with 1, so SageMaker replaces it.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from gguf_serve.container.hop.models import ServedModels
from gguf_serve.container.hop.proxy import Admission
from gguf_serve.container.launch.cpu import amx_plan
from gguf_serve.container.launch.preflight import EX_CONFIG, LaunchRefused
from gguf_serve.container.launch.serve import (
    describe,
    resolve_binary,
    server_command,
    server_environment,
    undumpable,
)
from gguf_serve.container.names import API_KEY_ENV, RUNTIME_SPEC_ENV, UPSTREAM_PORT
from gguf_serve.container.sagemaker import contract
from gguf_serve.container.sagemaker.emf import DIM_ENDPOINT, DIM_VARIANT, EmfEmitter, drain_datums
from gguf_serve.container.sagemaker.front import SageMakerFront
from gguf_serve.container.sagemaker.model import verify_model
from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError

log = logging.getLogger("gguf-serve-sagemaker")
PREFIX = "gguf-serve-sagemaker"
DRAIN_MARGIN_S = 5.0  # of SageMaker's 30 s: the drain's books, its metrics line and llama-server's stop
STOP_GRACE_S = 1.5  # llama-server's own SIGTERM, then SIGKILL: the container is going away


@dataclass(frozen=True)
class Ports:
    front: int  # where SageMaker connects
    upstream: int  # llama-server, on loopback


def load_spec(environ: Mapping[str, str]) -> RuntimeSpec:
    text = environ.get(RUNTIME_SPEC_ENV)
    if not text:
        raise LaunchRefused(
            f"{RUNTIME_SPEC_ENV} is not set: the SageMaker model's Environment must carry the runtime spec "
            "(the SageMaker stacks set it; gguf_serve.catalog's ServingProfile.runtime_json() writes it)"
        )
    try:
        return RuntimeSpec.from_json(text, source=RUNTIME_SPEC_ENV)
    except RuntimeSpecError as e:
        raise LaunchRefused(str(e)) from None


def _port(text: str, name: str) -> int:
    if not text.strip().isdigit() or not 0 < int(text) < 65536:
        raise LaunchRefused(f"{name}={text!r} is not a TCP port (1-65535)")
    return int(text)


def ports(environ: Mapping[str, str]) -> Ports:
    """The front's port (SAGEMAKER_BIND_TO_PORT, else 8080) and llama-server's, never the same one."""
    bind = environ.get(contract.BIND_PORT_ENV)
    front = _port(bind, contract.BIND_PORT_ENV) if bind else contract.DEFAULT_PORT
    safe = environ.get(contract.SAFE_PORT_RANGE_ENV)
    if not safe:
        return Ports(front, UPSTREAM_PORT if front != UPSTREAM_PORT else UPSTREAM_PORT + 1)
    low, sep, high = safe.partition("-")
    first, last = _port(low, contract.SAFE_PORT_RANGE_ENV), _port(high if sep else low, contract.SAFE_PORT_RANGE_ENV)
    choices = [p for p in range(first, last + 1) if p != front]
    if not choices:
        raise LaunchRefused(f"{contract.SAFE_PORT_RANGE_ENV}={safe!r} leaves no port for llama-server beside {front}")
    return Ports(front, choices[0])


class Supervisor:
    def __init__(self, spec: RuntimeSpec, ports: Ports, environ: Mapping[str, str], model_dir: Path) -> None:
        self.spec = spec
        self.ports = ports
        self.environ = environ
        self.model_dir = model_dir
        self.front = SageMakerFront(
            ("0.0.0.0", ports.front),  # noqa: S104 - SageMaker connects from outside the container
            f"http://127.0.0.1:{ports.upstream}",
            admission=Admission(slots=spec.server.parallel, queue_per_slot=spec.server.queue_per_slot),
            gate=contract.IAM_GATE,
            models=ServedModels(spec.model.served_names),  # another model's name: 404 model_not_found
        )
        self.proc: subprocess.Popen | None = None
        self.stop = threading.Event()
        self.signalled_at: float | None = None
        self.emitter = EmfEmitter(
            upstream_url=f"http://127.0.0.1:{ports.upstream}",
            hop_exposition=self.front.hop_exposition,
            slots=spec.server.parallel,
            dimensions={
                DIM_ENDPOINT: environ.get(contract.ENDPOINT_ENV, "unknown"),
                DIM_VARIANT: environ.get(contract.VARIANT_ENV, contract.VARIANT_NAME),
            },
        )

    def _signal(self, signum: int, _frame: object) -> None:
        if self.proc is None:  # still checking the model: nothing is served, nothing to drain
            raise SystemExit(0)
        if self.signalled_at is None:
            self.signalled_at = time.monotonic()
            log.info("%s received: draining", signal.Signals(signum).name)
        self.stop.set()

    def run(self) -> int:
        threading.Thread(target=self.front.serve_forever, name="front", daemon=True).start()
        log.info("front on port %d (llama-server on 127.0.0.1:%d)", self.ports.front, self.ports.upstream)
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, self._signal)
        model = verify_model(self.spec, self.model_dir, log=log.info)
        spec = replace(self.spec, server=replace(self.spec.server, host="127.0.0.1", port=self.ports.upstream))
        env, ignored, withheld = server_environment(self.environ, require_api_key=False)
        env.pop(API_KEY_ENV, None)  # IAM is the gate: a key would also lock the metrics scrape out
        if ignored:
            log.info("ignoring inherited %s (the runtime spec sets every flag)", ", ".join(ignored))
        if withheld:
            log.info("not passed to llama-server: %s", ", ".join(withheld))
        # llama-server runs as this process's user: made undumpable, this process's /proc/<pid>/environ and memory
        # (the role's credential URI, the credentials botocore holds) are root's only, as ptrace is.
        undumpable()
        log.info("supervisor undumpable: llama-server cannot read its environment or memory")
        amx = amx_plan()
        log.info("%s", amx.line)
        command = server_command(spec, model, resolve_binary(None), amx=amx)
        log.info("%s", describe(spec, command).removeprefix("gguf-serve-launch: "))
        sys.stdout.flush()
        self.proc = subprocess.Popen(command, env=env, stdin=subprocess.DEVNULL)  # noqa: S603 - argv, no shell
        threading.Thread(target=self.emitter.run, args=(self.stop,), name="metrics", daemon=True).start()
        while not self.stop.wait(0.5):
            if (code := self.proc.poll()) is not None:
                log.error("llama-server exited with %s; ending the container so SageMaker replaces it", code)
                self.front.shutdown()
                return 1
        return self._drain()

    def _drain(self) -> int:
        started = self.signalled_at or time.monotonic()
        until = started + contract.SIGKILL_AFTER_S - DRAIN_MARGIN_S
        front = self.front
        front.call(lambda: front.begin_drain("SIGTERM", time.time() + (until - time.monotonic())))
        while front.in_flight and time.monotonic() < until and self.proc.poll() is None:
            time.sleep(0.1)
        drain = front.call(front.end_drain)
        if drain is not None:
            log.info("%s", drain.summary())
            self.emitter.write(drain_datums(drain))
        self._stop_server()
        front.shutdown()
        return 0

    def _stop_server(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main(environ: Mapping[str, str] | None = None, model_dir: str = contract.MODEL_DIR) -> int:
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s {PREFIX} %(levelname)s %(message)s", stream=sys.stderr)
    environ = os.environ if environ is None else environ
    try:
        supervisor = Supervisor(load_spec(environ), ports(environ), environ, Path(model_dir))
        return supervisor.run()
    except LaunchRefused as e:
        log.error("refusing to start: %s", e)
        return EX_CONFIG
    except OSError as e:  # the port is taken, the model folder unreadable
        log.error("cannot start: %s", e)
        return EX_CONFIG
