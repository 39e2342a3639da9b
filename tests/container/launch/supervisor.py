"""A small supervisor with the restart rules of the instance's systemd unit, for machines without systemd.

Equivalent of:
    Restart=always
    RestartSec=5
    RestartPreventExitStatus=78     (the launcher's refusal: a wrong model will not fix itself)

systemd's always restarts after any exit of the main process, clean or not (llama-server exits 0 on SIGTERM),
unless the unit is being stopped or the exit status is listed in RestartPreventExitStatus, which applies
"regardless of the restart setting" (systemd.service(5)). Start-rate limiting (StartLimitBurst=5 in 10 s)
never triggers with RestartSec=5, so it is left out.
"""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


def restart_wanted(returncode: int, prevent_exit_status: frozenset[int]) -> bool:
    """Restart=always: would systemd start the service again after this exit (not a `systemctl stop`)?"""
    return returncode not in prevent_exit_status


@dataclass
class Supervisor:
    start: Callable[[], Any]  # returns an object with `.proc` (a Popen), e.g. gguf_serve.local.process.ServerProcess
    restart_sec: float = 5.0
    prevent_exit_status: frozenset[int] = frozenset({78})
    exits: list[int] = field(default_factory=list)  # every exit code seen, in order
    current: Any = None
    _stopping: threading.Event = field(default_factory=threading.Event)
    _changed: threading.Condition = field(default_factory=threading.Condition)
    _thread: threading.Thread | None = None

    def run(self) -> Supervisor:
        self._launch()
        self._thread = threading.Thread(target=self._loop, name="supervisor", daemon=True)
        self._thread.start()
        return self

    def _launch(self) -> None:
        with self._changed:
            self.current = self.start()
            self._changed.notify_all()

    def _loop(self) -> None:
        while True:
            proc: subprocess.Popen = self.current.proc
            code = proc.wait()
            self.exits.append(code)
            if self._stopping.is_set() or not restart_wanted(code, self.prevent_exit_status):
                with self._changed:
                    self._changed.notify_all()
                return
            if self._stopping.wait(self.restart_sec):
                return
            self._launch()

    def wait_for_new_process(self, old: Any, timeout: float) -> Any:
        with self._changed:
            self._changed.wait_for(lambda: self.current is not old or not self.alive, timeout)
        return self.current

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def stop(self, timeout: float = 30.0) -> None:
        self._stopping.set()
        if self.current is not None and self.current.proc.poll() is None:
            self.current.proc.terminate()
            self.current.proc.wait(timeout)
        if self._thread is not None:
            self._thread.join(timeout)
