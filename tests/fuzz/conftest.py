"""The fuzz tier: hypothesis over the three parsers that read what another machine sends or wrote.

Deterministic by default (CI runs the same examples each time); FUZZ_EXAMPLES=5000 explores further.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "fuzz",
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "300")),
    deadline=2000,  # ms per example: any input must end quickly
    derandomize=os.environ.get("FUZZ_EXAMPLES") is None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.load_profile("fuzz")
