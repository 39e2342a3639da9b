"""Build llama-server's command line and environment from a runtime spec, and exec() it."""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import NamedTuple

from gguf_serve.container.flags import llama_server_args
from gguf_serve.container.launch.cpu import AmxPlan
from gguf_serve.container.launch.preflight import LaunchRefused
from gguf_serve.container.names import API_KEY_ENV
from gguf_serve.container.spec import RuntimeSpec

DEFAULT_BINARY = "/usr/local/bin/llama-server"
# llama-server reads LLAMA_ARG_* as flag defaults; an inherited LLAMA_ARG_SPEC_TYPE cannot be cleared by a
# later flag, so the runtime spec is the only source of settings and these never reach the server.
_INHERITED_PREFIX = "LLAMA_ARG_"


def resolve_binary(path: str | None) -> str:
    """The llama-server to run: the given path, the image's /usr/local/bin/llama-server, or one on PATH."""
    candidate = path or (DEFAULT_BINARY if os.path.exists(DEFAULT_BINARY) else shutil.which("llama-server"))
    if not candidate or not os.access(candidate, os.X_OK):
        raise LaunchRefused(
            f"no executable llama-server at {candidate or DEFAULT_BINARY}: pass --llama-server PATH "
            "(scripts/build-llama-server.sh builds one)"
        )
    return candidate


# ggml's AMX matmul runs only on tensors placed in its "extra" buffer type; --no-repack keeps every weight in
# plain CPU buffers, so a CPU whose AMX faults (cpuid lies) never reaches it. The x86-64 image's loader picks
# its sapphirerapids variant from cpuid alone, so this is the one switch that holds for every build.
NO_EXTRA_BUFFERS = "--no-repack"


def server_command(
    spec: RuntimeSpec, model_path: Path, binary: str, *, benchmark: bool = False, amx: AmxPlan | None = None
) -> list[str]:
    """llama-server's argv: the spec's flags, and --no-repack where cpuid promises AMX a probe cannot execute."""
    command = [binary, *llama_server_args(spec, str(model_path), benchmark=benchmark)]
    if amx is not None and amx.avoid:
        command.append(NO_EXTRA_BUFFERS)
    return command


class ServerEnvironment(NamedTuple):
    env: dict[str, str]  # what llama-server gets
    ignored: list[str]  # inherited LLAMA_ARG_* (the runtime spec sets every flag)
    withheld: list[str]  # everything else it does not need: credentials, tokens, the supervisor's settings


# What llama-server may read from its environment; nothing else reaches it. It needs no AWS credential (the role's
# are for the fetcher, the hop and the metrics publisher: AWS_ACCESS_KEY_ID, AWS_SESSION_TOKEN,
# AWS_CONTAINER_CREDENTIALS_RELATIVE_URI, AWS_WEB_IDENTITY_TOKEN_FILE, ...) and no ModelScope token, so a server
# process that a hostile request took over finds none. The names: the loader's and libc's (PATH, LD_LIBRARY_PATH,
# HOME, TMPDIR, locale, TZ), ggml's and OpenMP's tuning (GGML_*, OMP_*, KMP_*), the CUDA runtime's and the NVIDIA
# container toolkit's (CUDA_*, NVIDIA_*), and the API key.
_SERVER_NAMES = frozenset({"PATH", "LD_LIBRARY_PATH", "HOME", "TMPDIR", "LANG", "LANGUAGE", "TZ", API_KEY_ENV})
_SERVER_PREFIXES = ("LC_", "GGML_", "OMP_", "KMP_", "CUDA_", "NVIDIA_")


def server_environment(env: Mapping[str, str], *, require_api_key: bool = True) -> ServerEnvironment:
    """llama-server's environment: the names it may read (above) and nothing else, LLAMA_ARG_* never."""
    if require_api_key and not env.get(API_KEY_ENV):
        raise LaunchRefused(
            f"{API_KEY_ENV} is not set: llama-server would serve without authentication. Set it (the instance "
            "reads it from Secrets Manager), or pass --no-api-key for local development"
        )
    ignored = sorted(k for k in env if k.startswith(_INHERITED_PREFIX))
    kept = {k: v for k, v in env.items() if k in _SERVER_NAMES or k.startswith(_SERVER_PREFIXES)}
    withheld = sorted(k for k in env if k not in kept and k not in ignored)
    return ServerEnvironment(kept, ignored, withheld)


PR_SET_DUMPABLE = 4  # <linux/prctl.h>


def undumpable() -> None:
    """Make this process undumpable (prctl(2) PR_SET_DUMPABLE 0): its /proc/<pid>/environ, mem and maps become
    root's and ptrace by the same user is refused, so a child of the same user (llama-server, whose execve makes it
    dumpable again) cannot read what this process holds. Raises OSError where the kernel refuses."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_DUMPABLE, 0)")


def describe(spec: RuntimeSpec, command: list[str]) -> str:
    """One log line: what starts, with which settings (argv never carries the API key)."""
    s = spec.server
    mtp = f"MTP {s.speculative.spec_type} n_max={s.speculative.draft_n_max}" if s.speculative else "MTP off"
    return (
        f"gguf-serve-launch: starting llama-server for profile {spec.name!r}: {spec.model.name}, "
        f"{s.parallel} slot(s) x {s.ctx_per_slot} ctx, {spec.threads} threads, {s.gpu_layers} GPU layers, "
        f"{mtp}; {' '.join(command)}"
    )


def exec_server(command: list[str], env: dict[str, str]) -> None:
    """Replace this process with llama-server: signals from the container runtime reach it directly."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(command[0], command, env)  # noqa: S606 - argv list, no shell
