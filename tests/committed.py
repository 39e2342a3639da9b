"""The committed catalog (profiles/), loaded once for the tests that read it: tests are an entry point too.

The library keeps no default catalog (gguf_serve.catalog.loader loads, callers pass a `Catalog`); these names are the
tests' own shorthand for that one load.
"""

from __future__ import annotations

from typing import Any

from gguf_serve.catalog import Catalog, ServingProfile, load_catalog
from gguf_serve.catalog import local as _local
from gguf_serve.catalog import profiles as _profiles

CATALOG: Catalog = load_catalog()
HARDWARE = CATALOG.hardware
MODELS = CATALOG.models
PROFILES = CATALOG.profiles
QWEN36_35B_A3B = MODELS["Qwen3.6-35B-A3B"]
QWEN36_27B_MTP = MODELS["Qwen3.6-27B"]
GEMMA3_270M = MODELS["Gemma-3-270M"]


def default_catalog() -> Catalog:
    return CATALOG


def profile_by_stack(stack_name: str) -> ServingProfile:
    return CATALOG.profile_by_stack(stack_name)


def local_profile(base: str = "graviton-moe", **kwargs: Any) -> ServingProfile:
    return _local.local_profile(CATALOG, base, **kwargs)


def build_profile(**kwargs: Any) -> ServingProfile:
    return _profiles.build_profile(hardware=HARDWARE, models=MODELS, **kwargs)
