"""Load and chaos on loopback against the real llama-server: valid streams through the hop while idle and
half-sent connections are held and large keyless bodies arrive. Counts are small so that it takes about a
minute on 2 cores; tests/benchmarks/hop_chaos.py runs the big numbers (256 / 1000 / 4 x 1 GiB) and prints them."""

from __future__ import annotations

import pytest

from tests.benchmarks import hop_chaos

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MIB = 1024 * 1024
HOP_RSS_BOUND_MIB = 200  # the hop held +534 MiB after four such bodies when it buffered them


def test_valid_streams_survive_idle_connections_and_keyless_bodies(llama_server_binary, gemma_gguf) -> None:
    r = hop_chaos.run_chaos(
        2,
        streams=8,
        idle=200,
        bodies=2,
        body_declared=24 * MIB,  # under the cap: streamed to llama-server, which answers 401 (no key) early
        body_send=24 * MIB,
        max_tokens=8,
        max_body_mib=32,
    )
    p99_ms = 1000 * hop_chaos.pct(r.health_s, 0.99)
    print(f"chaos: {len(r.streams)} streams in {r.seconds:.1f} s, /health p99 {p99_ms:.0f} ms over "
          f"{len(r.health_s)} probes, hop RSS peak {r.hop_peak_rss_mib:.1f} MiB, bodies {r.bodies}")  # fmt: skip
    assert not r.errors, [s.error for s in r.errors]
    assert r.health_s and r.health_failed == 0, f"{r.health_failed} /health probes had no 200 within 1 s"
    assert r.hop_peak_rss_mib < HOP_RSS_BOUND_MIB, f"the hop's peak RSS was {r.hop_peak_rss_mib:.0f} MiB"
    assert all(b.startswith("answered 401") for b in r.bodies), r.bodies  # llama-server's own refusal, relayed
    assert r.idle_held >= 100  # the quiet half stays open (idle timeout 620 s); nothing was refused for them


def test_a_declared_gibibyte_is_413_at_once(llama_server_binary, gemma_gguf) -> None:
    r = hop_chaos.run_chaos(2, streams=2, idle=0, bodies=2, body_declared=1024 * MIB, body_send=64 * MIB,
                            max_tokens=4, max_body_mib=64)  # fmt: skip
    assert not r.errors and r.hop_peak_rss_mib < HOP_RSS_BOUND_MIB
    assert all(b.startswith("answered 413") for b in r.bodies), r.bodies  # from the head alone
