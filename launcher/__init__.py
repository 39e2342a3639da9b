"""Turns a serving profile into a running llama-server: the same code in the container and on a laptop.

`python -m launcher serve` checks the GGUF against the profile, then exec()s llama-server with the catalog's
flags; `python -m launcher fetch` delivers the model; `python -m launcher.local` is the embedded default.
Runtime dependencies: the standard library, `runtime` and `modelfetch` (urllib3, boto3) only.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so that `python -m launcher health` (the container HEALTHCHECK) imports neither.
_EXPORTS = {
    "EX_CONFIG": "launcher.preflight",
    "LaunchRefused": "launcher.preflight",
    "check_gpu": "launcher.preflight",
    "check_model": "launcher.preflight",
    "server_command": "launcher.serve",
    "server_environment": "launcher.serve",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'launcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
