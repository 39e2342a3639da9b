"""Keyless clients against the hop in front of the real llama-server (tests/benchmarks/hop_keyless.py with small
counts): slow keyless bodies hold nothing and /health answers, a keyless flood is all 401 and sheds nothing while
keyed requests are served, a burst past the cap keeps the count real. About a minute on 2 cores."""

from __future__ import annotations

import asyncio

import pytest

from gguf_serve.local.process import PACKAGE_ROOT
from tests.benchmarks import hop_keyless

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_keyless_clients_take_neither_the_port_nor_an_admission_place(llama_server_binary, gemma_gguf) -> None:
    cap = 40
    with hop_keyless.serving(PACKAGE_ROOT, "--max-connections", str(cap)) as hop:
        slow = asyncio.run(hop_keyless.slow_bodies(hop.port, cap + 20, hold_s=4))
        flood = asyncio.run(hop_keyless.flood(hop.port, hop.key, tasks=16, seconds=4))
        shed = hop_keyless.shed(hop)
        burst = asyncio.run(hop_keyless.burst(hop, 3 * cap))
    print(f"slow {slow}, flood {flood}, shed {shed}, burst {burst}")
    assert slow["held"] == 0 and slow["health_ok"] == slow["health_probes"]
    assert set(flood["keyless"]) == {401} and shed == 0
    # never shed: keyless requests hold no admission place (a keyed answer slower than 30 s on a loaded machine
    # counts as 0, the client's timeout, not the hop's refusal)
    assert 429 not in flood["keyed"] and flood["keyed"].get(200, 0) >= 1
    assert burst["count"] <= cap and burst["health_ok"] == 5
