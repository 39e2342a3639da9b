"""The deployment-profile catalog: the one place where hardware, model artifacts and llama-server settings live.

The types (hardware, models, fleet, images, profiles) load nothing; `load_catalog()` (gguf_serve.catalog.loader) reads
profiles/ into a `Catalog`, and each entry point calls it once and passes that on. What the serving image needs
at run time (the runtime spec, the server flags, the shared names) is the `runtime` package, which never
imports this one.
"""

from __future__ import annotations

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.fleet import FleetSettings
from gguf_serve.catalog.hardware import Architecture, Hardware
from gguf_serve.catalog.loader import Catalog, load_catalog
from gguf_serve.catalog.models import ModelArtifact
from gguf_serve.catalog.profiles import ServingProfile

__all__ = [
    "Architecture",
    "Catalog",
    "FleetSettings",
    "Hardware",
    "ModelArtifact",
    "ProfileError",
    "ServingProfile",
    "load_catalog",
]
