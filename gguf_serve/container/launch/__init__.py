"""Turns a serving profile into a running llama-server: the same code in the container and on a laptop.

`gguf-serve-launch serve` checks the GGUF against the profile, then exec()s llama-server with the catalog's
flags; `gguf-serve-launch fetch` delivers the model; `gguf-serve-demo` is the embedded default.
Runtime dependencies: the standard library, `runtime` and `modelfetch` (urllib3, boto3) only.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so that `gguf-serve-launch health` (the container HEALTHCHECK) imports neither.
_EXPORTS = {
    "EX_CONFIG": "gguf_serve.container.launch.preflight",
    "LaunchRefused": "gguf_serve.container.launch.preflight",
    "check_gpu": "gguf_serve.container.launch.preflight",
    "check_model": "gguf_serve.container.launch.preflight",
    "server_command": "gguf_serve.container.launch.serve",
    "server_environment": "gguf_serve.container.launch.serve",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'launcher' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
