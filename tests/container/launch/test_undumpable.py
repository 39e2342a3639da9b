"""undumpable(): a process of the same user cannot read an undumpable process's environment, and can read a
dumpable one's (the control). The SageMaker supervisor calls it before it starts llama-server as its own user
(gguf_serve/container/sagemaker/serve.py). Run as an unprivileged user (a forked child drops to nobody when the
tests run as root), since root reads any process's /proc whatever its dumpable flag."""

from __future__ import annotations

import ctypes
import os
import time

from gguf_serve.container.launch.serve import PR_SET_DUMPABLE, undumpable

NOBODY = 65534


def _read_as_same_user(make_undumpable: bool) -> int:
    """Fork: the child (unprivileged) forks a target, optionally made undumpable, and tries to read the target's
    /proc/<pid>/environ (the environment it started with: on SageMaker, the role's credential path). Exit code: 0
    read in full, 13 refused (EACCES), 1 anything else."""
    with open("/proc/self/environ", "rb") as f:
        expected = f.read()  # what a forked target's /proc/<pid>/environ shows: the block this process started with
    pid = os.fork()
    if pid == 0:  # the unprivileged reader
        code = 1
        try:
            if os.geteuid() == 0:
                os.setgroups([])
                os.setgid(NOBODY)
                os.setuid(NOBODY)
                # a change of user leaves a process undumpable (prctl(2)): back to an ordinary process's flag
                ctypes.CDLL(None, use_errno=True).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)
            ready_r, ready_w = os.pipe()
            target = os.fork()
            if target == 0:  # the target: the environment it was started with (/proc shows that block), read or not
                if make_undumpable:
                    undumpable()
                os.write(ready_w, b"x")
                time.sleep(30)
                os._exit(0)
            os.read(ready_r, 1)
            try:
                with open(f"/proc/{target}/environ", "rb") as f:
                    code = 0 if f.read() == expected else 1
            except PermissionError:
                code = 13
            os.kill(target, 9)
            os.waitpid(target, 0)
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_an_undumpable_process_environ_is_refused_to_its_own_user():
    assert _read_as_same_user(make_undumpable=True) == 13


def test_control_a_dumpable_process_environ_is_read_by_its_own_user():
    assert _read_as_same_user(make_undumpable=False) == 0
