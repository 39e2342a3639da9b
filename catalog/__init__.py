"""The deployment-profile catalog: the one place where hardware, model artifacts and llama-server settings live.

The types (hardware, models, fleet, images, profiles) load nothing; `load_catalog()` (catalog.loader) reads
profiles/ into a `Catalog`, and each entry point calls it once and passes that on. What the serving image needs
at run time (the runtime spec, the server flags, the shared names) is the `runtime` package, which never
imports this one.
"""

from __future__ import annotations

from catalog.errors import ProfileError
from catalog.fleet import FleetSettings
from catalog.hardware import Architecture, Hardware
from catalog.loader import Catalog, load_catalog
from catalog.models import ModelArtifact
from catalog.profiles import ServingProfile

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
