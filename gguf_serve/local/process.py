"""Run `gguf-serve-launch serve` as a child process and wait for it: the local runner's and tests' handle.

The child is the same entry point the container runs; after its checks it exec()s llama-server, so the
child's pid is llama-server's and its exit code is either the launcher's refusal (78) or llama-server's.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gguf_serve.container.launch.preflight import EX_CONFIG
from gguf_serve.container.names import API_KEY_ENV

if TYPE_CHECKING:
    from gguf_serve.catalog.profiles import ServingProfile

PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the checkout: the directory holding gguf_serve/


class ServerExited(RuntimeError):
    """The server process ended before it was healthy; the message carries the lines that say why."""

    def __init__(self, returncode: int, tail: str, refused: bool) -> None:
        self.returncode = returncode
        self.tail = tail
        self.refused = refused
        if refused:
            msg = f"the launcher refused to start llama-server (exit {returncode}):\n{tail}"
        else:
            msg = (
                f"llama-server exited with {_describe_exit(returncode)} before /health answered 200; "
                f"last log lines:\n{tail}"
            )
        super().__init__(msg)


def _describe_exit(code: int) -> str:
    if code < 0:
        return f"signal {signal.Signals(-code).name}"
    return f"code {code}"


@dataclass
class ServerProcess:
    proc: subprocess.Popen
    url: str
    log_path: Path
    api_key: str | None
    statuses: list[int | None] = field(default_factory=list)  # every /health answer seen while waiting

    @property
    def pid(self) -> int:
        return self.proc.pid

    def health(self, timeout: float = 2.0) -> int | None:
        """The /health status code, or None while nothing listens."""
        try:
            with urllib.request.urlopen(f"{self.url}/health", timeout=timeout) as r:  # noqa: S310 - loopback URL
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def wait_healthy(self, timeout: float = 180.0, interval: float = 0.05) -> float:
        """Seconds until /health answered 200; raises ServerExited with the log's last lines if it ends first."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            code = self.proc.poll()
            if code is not None:
                raise ServerExited(code, self.tail(), refused=code == EX_CONFIG)
            status = self.health()
            if not self.statuses or self.statuses[-1] != status:
                self.statuses.append(status)
            if status == 200:
                return time.monotonic() - start
            time.sleep(interval)
        raise TimeoutError(f"llama-server not healthy after {timeout:.0f} s; last log lines:\n{self.tail()}")

    def tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.rstrip().splitlines()[-lines:])

    def stop(self, timeout: float = 30.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def __enter__(self) -> ServerProcess:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def launch_command(
    profile_path: Path, model_dir: Path, binary: Path | str, *, benchmark: bool = False, api_key: bool = True
) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        "gguf_serve.container.launch",
        "serve",
        "--spec",
        str(profile_path),
        "--model-dir",
        str(model_dir),
    ]
    cmd += ["--llama-server", str(binary)]
    if benchmark:
        cmd.append("--benchmark")
    if not api_key:
        cmd.append("--no-api-key")
    return cmd


def launcher_env(api_key: str | None, base: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(PACKAGE_ROOT), env.get("PYTHONPATH", "")) if p)
    env.pop(API_KEY_ENV, None)
    if api_key:
        env[API_KEY_ENV] = api_key
    return env


def start_server(
    profile: ServingProfile,
    model_dir: Path,
    *,
    binary: Path | str,
    api_key: str | None,
    workdir: Path,
    benchmark: bool = False,
) -> ServerProcess:
    """Write the profile's runtime spec to `workdir`, start `gguf-serve-launch serve` on it; log to server.log."""
    workdir.mkdir(parents=True, exist_ok=True)
    profile_path = workdir / "runtime.json"
    profile_path.write_text(profile.runtime().to_json())
    log_path = workdir / "server.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            launch_command(profile_path, model_dir, binary, benchmark=benchmark, api_key=api_key is not None),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=launcher_env(api_key),
        )
    host = "127.0.0.1" if profile.server.host in ("0.0.0.0", "127.0.0.1") else profile.server.host  # noqa: S104
    return ServerProcess(proc=proc, url=f"http://{host}:{profile.server.port}", log_path=log_path, api_key=api_key)


def free_port() -> int:
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """`count` distinct loopback ports that were free a moment ago (all held open at once while they are picked)."""
    import contextlib
    import socket

    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket()) for _ in range(count)]
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]


def port_taken(port: int, host: str = "127.0.0.1") -> bool:
    """True when something already listens on (or holds) host:port."""
    import socket

    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False
