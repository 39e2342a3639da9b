"""Drain in a Kubernetes pod: the preStop hook asks the hop to drain, and waits until its streams are done.

A pod has no instance metadata to watch. Its container's preStop hook runs `python3 -m gguf_serve.container.hop.pod
prestop`, which sends SIGUSR1 to the hop (PID 1 of its container), and waits for the drain's outcome file. The hop
then answers /health 503 (the pod's readiness probe fails and the load balancer's health check stops choosing the
node) and new slot-taking requests 503 with Retry-After, while streams already admitted run to their end; when none
is left, or at the drain deadline, it writes the outcome (streams finished, cut, refused) to the file. Only then does
the preStop hook return, so the kubelet's SIGTERM (which stops the hop at once) finds nothing running. The grace
period covers the deadline: "the kubelet runs the preStop hook, then sends TERM; terminationGracePeriodSeconds
counts from the start of the hook" (Kubernetes docs, "Container Lifecycle Hooks" and "Pod Lifecycle",
"Termination of Pods").
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger("gguf-serve-hop")

DRAIN_SIGNAL = signal.SIGUSR1
POLL_S = 0.5
REASON = "pod terminating"


@dataclass(frozen=True)
class DrainOutcome:
    """What the preStop hook prints, and the rehearsal checks: one drain's books."""

    reason: str
    finished: int
    cut: int
    broken: int
    refused: int
    seconds: float


class PodDrainer:
    """Beside the hop's connections (ProxyServer starts `run`): drains once `request()` was called (the signal
    handler calls it), ends the drain when no stream is left or at the deadline, and writes the outcome."""

    def __init__(self, *, deadline_s: float, report: Path, poll_s: float = POLL_S) -> None:
        if deadline_s <= 0:
            raise ValueError(f"the drain deadline must be positive, got {deadline_s}")
        self.deadline_s = deadline_s
        self.report = report
        self.poll_s = poll_s
        self.requested = False  # set from a signal handler: a plain attribute, read by the loop
        with contextlib.suppress(FileNotFoundError):
            report.unlink()  # an outcome left by an earlier life of this container is not this drain's

    def request(self) -> None:
        self.requested = True

    def install(self) -> None:
        """SIGUSR1 asks for the drain (from the main thread, before serving)."""
        signal.signal(DRAIN_SIGNAL, lambda *_: self.request())

    async def run(self, server: Any) -> None:
        while True:
            self.step(server)
            await asyncio.sleep(self.poll_s)

    def step(self, server: Any) -> None:
        if self.requested and server.drain is None:
            server.begin_drain(REASON, time.time() + self.deadline_s)
        drain = server.drain
        if drain is None or drain.done:
            return
        if server.in_flight == 0 or time.time() >= drain.deadline:
            server.end_drain()
            log.info("%s", drain.summary())
            self._write(drain)

    def _write(self, drain: Any) -> None:
        outcome = DrainOutcome(
            reason=drain.reason,
            finished=drain.finished,
            cut=drain.cut or 0,
            broken=drain.broken,
            refused=drain.refused,
            seconds=round((drain.ended or time.time()) - drain.started, 3),
        )
        partial = self.report.with_name(self.report.name + ".part")
        partial.write_text(json.dumps(asdict(outcome)))
        partial.replace(self.report)  # the preStop hook never reads half a file


def prestop(pid: int, report: Path, wait_s: float, poll_s: float = POLL_S) -> int:
    """Ask the hop at `pid` to drain and wait up to `wait_s` for its outcome; print it. 0 when the drain ended."""
    try:
        os.kill(pid, DRAIN_SIGNAL)
    except ProcessLookupError:
        print(f"gguf-serve-hop prestop: no hop at pid {pid}: nothing to drain", flush=True)
        return 0
    until = time.monotonic() + wait_s
    while time.monotonic() < until:
        if report.exists():
            outcome = DrainOutcome(**json.loads(report.read_text()))
            print(f"gguf-serve-hop prestop: drained: {json.dumps(asdict(outcome), sort_keys=True)}", flush=True)
            return 0
        time.sleep(poll_s)
    print(f"gguf-serve-hop prestop: no drain outcome in {report} after {wait_s:.0f} s", file=sys.stderr, flush=True)
    return 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gguf-serve-hop prestop", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("prestop", help="drain the hop and wait for its streams (a container's preStop hook)")
    s.add_argument("--pid", type=int, default=1, help="the hop's pid (default 1: the container's own process)")
    s.add_argument("--report", type=Path, required=True, help="the drain outcome file the hop writes (--pod-drain)")
    s.add_argument("--wait", type=float, required=True, help="seconds to wait: the drain deadline and a margin")
    args = p.parse_args(argv)
    return prestop(args.pid, args.report, args.wait)


if __name__ == "__main__":
    sys.exit(main())
