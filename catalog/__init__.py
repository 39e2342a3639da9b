"""The deployment-profile catalog: the one place where hardware, model artifacts and llama-server settings live.

Stacks, user data, the local runner, the benchmark and the cost model read profiles from here. The serving
container reads only the runtime spec (catalog.runtime) and the shared names (catalog.names): exports are
loaded on first use, so `import catalog.runtime` never loads the profiles. Standard library only.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "ProfileError": "catalog.errors",
    "HARDWARE": "catalog.hardware",
    "Architecture": "catalog.hardware",
    "Hardware": "catalog.hardware",
    "MODELS": "catalog.models",
    "ModelArtifact": "catalog.models",
    "PROFILES": "catalog.profiles",
    "ServingProfile": "catalog.profiles",
    "local_profile": "catalog.profiles",
    "profile_by_stack": "catalog.profiles",
    "RuntimeSpec": "catalog.runtime",
    "RuntimeSpecError": "catalog.runtime",
    "ServerSettings": "catalog.server",
    "Speculative": "catalog.server",
    "llama_server_args": "catalog.server",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'catalog' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
