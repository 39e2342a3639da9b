"""derive(): gauges, rates between scrapes, counter resets, busy slots and draft acceptance."""

from __future__ import annotations

import pytest

from gguf_serve.container.metrics import derive, names, parse_prometheus
from tests.container.metrics.conftest import captured, metrics_text


def scrape(**values):
    return parse_prometheus(metrics_text(**values))


def as_dict(datums):
    out = {d.name: (d.value, d.unit) for d in datums}
    assert len(out) == len(datums), "a metric appears twice"
    return out


def test_first_scrape_publishes_gauges_only():
    got = as_dict(derive(None, scrape(requests_processing=2, requests_deferred=5, tokens_predicted_total=900), 60))
    assert got == {
        names.REQUESTS_PROCESSING: (2, "Count"),
        names.REQUESTS_DEFERRED: (5, "Count"),
    }


def test_rates_are_counter_deltas_over_elapsed_seconds():
    prev = scrape(tokens_predicted_total=100, prompt_tokens_total=1000, prompt_tokens_cached_total=50)
    cur = scrape(tokens_predicted_total=700, prompt_tokens_total=4000, prompt_tokens_cached_total=9000)
    got = as_dict(derive(prev, cur, 60.0))
    assert got[names.GENERATED_TPS] == (pytest.approx(10.0), "Count/Second")
    assert got[names.PROMPT_TPS] == (pytest.approx(50.0), "Count/Second")  # cache hits are not work


def test_idle_interval_publishes_zero_rates():
    got = as_dict(derive(scrape(tokens_predicted_total=5), scrape(tokens_predicted_total=5), 60))
    assert got[names.GENERATED_TPS] == (0.0, "Count/Second")
    assert got[names.PROMPT_TPS] == (0.0, "Count/Second")


def test_real_captures_idle_then_three_requests():
    idle, after = (parse_prometheus(captured(f"metrics_{n}.txt")) for n in ("idle", "after_requests"))
    got = as_dict(derive(idle, after, 120))
    assert got[names.GENERATED_TPS][0] == pytest.approx(600 / 120)
    assert got[names.PROMPT_TPS][0] == pytest.approx(67 / 120)
    assert names.DRAFT_ACCEPTANCE not in got  # the counters exist but nothing was drafted


def test_counter_reset_counts_from_zero_never_negative():
    prev = scrape(tokens_predicted_total=100000, prompt_tokens_total=5000)
    cur = scrape(tokens_predicted_total=120, prompt_tokens_total=0)
    got = as_dict(derive(prev, cur, 60))
    assert got[names.GENERATED_TPS][0] == pytest.approx(2.0)
    assert got[names.PROMPT_TPS][0] == 0.0


def test_restart_seen_by_start_time_counts_from_zero_even_if_counters_grew():
    prev = scrape(tokens_predicted_total=30)
    cur = scrape(tokens_predicted_total=90)
    assert as_dict(derive(prev, cur, 60))[names.GENERATED_TPS][0] == pytest.approx(1.0)
    assert as_dict(derive(prev, cur, 60, restarted=True))[names.GENERATED_TPS][0] == pytest.approx(1.5)


@pytest.mark.parametrize("elapsed", [0, -3.0, float("nan")])
def test_no_rates_without_positive_elapsed_time(elapsed):
    got = as_dict(derive(scrape(tokens_predicted_total=1), scrape(tokens_predicted_total=9), elapsed))
    assert names.GENERATED_TPS not in got and names.PROMPT_TPS not in got
    assert names.REQUESTS_PROCESSING in got


def test_busy_slots_ratio_in_percent():
    got = as_dict(derive(None, scrape(requests_processing=3), 60, slots=4))
    assert got[names.SLOTS_BUSY_RATIO] == (75.0, "Percent")
    assert names.SLOTS_BUSY_RATIO not in as_dict(derive(None, scrape(requests_processing=3), 60))


def test_draft_acceptance_from_the_interval_only():
    prev = scrape(spec_decode_num_draft_tokens_total=1000, spec_decode_num_accepted_tokens_total=900)
    cur = scrape(spec_decode_num_draft_tokens_total=1200, spec_decode_num_accepted_tokens_total=1050)
    assert as_dict(derive(prev, cur, 60))[names.DRAFT_ACCEPTANCE] == (pytest.approx(75.0), "Percent")


def test_draft_acceptance_after_a_restart():
    prev = scrape(spec_decode_num_draft_tokens_total=1000, spec_decode_num_accepted_tokens_total=900)
    cur = scrape(spec_decode_num_draft_tokens_total=40, spec_decode_num_accepted_tokens_total=10)
    assert as_dict(derive(prev, cur, 60))[names.DRAFT_ACCEPTANCE][0] == pytest.approx(25.0)


def test_no_draft_acceptance_without_drafts_in_the_interval():
    prev = scrape(spec_decode_num_draft_tokens_total=50, spec_decode_num_accepted_tokens_total=40)
    assert names.DRAFT_ACCEPTANCE not in as_dict(derive(prev, prev, 60))


def test_missing_and_non_finite_families_are_skipped():
    families = parse_prometheus("llamacpp:requests_processing NaN\nllamacpp:requests_deferred 2\n")
    got = as_dict(derive(families, families, 60, slots=2))
    assert got == {names.REQUESTS_DEFERRED: (2, "Count")}


def test_the_hops_shed_requests_and_in_flight_from_its_own_exposition():
    """The names the metrics publisher spells out are the hop's (its `names`), read from a real RequestMetrics."""
    from gguf_serve.container.hop import names as hop_names
    from gguf_serve.container.hop.metrics import RequestMetrics
    from gguf_serve.container.metrics.derive import HOP_IN_FLIGHT, HOP_SHED

    assert (HOP_SHED, HOP_IN_FLIGHT) == (hop_names.SHED, hop_names.IN_FLIGHT)
    hop = RequestMetrics()
    hop.shed, hop.in_flight = 3, 6
    prev = parse_prometheus(metrics_text() + hop.exposition())
    hop.shed, hop.in_flight = 10, 4
    got = as_dict(derive(prev, parse_prometheus(metrics_text() + hop.exposition()), 60.0))
    assert got[names.REQUESTS_SHED] == (7, "Count") and got[names.HOP_REQUESTS_IN_FLIGHT] == (4, "Count")
    hop.shed = 2  # the hop restarted: count from zero, never negative
    restarted = as_dict(derive(prev, parse_prometheus(metrics_text() + hop.exposition()), 60.0))
    assert restarted[names.REQUESTS_SHED] == (2, "Count")


def test_output_tokens_are_the_increase_of_the_hops_counter_of_relayed_answers():
    """The hop counts each answer's predicted_n once it is relayed whole; the publisher sends the increase."""
    from gguf_serve.container.hop import names as hop_names
    from gguf_serve.container.hop.metrics import RequestMetrics, RequestRecord
    from gguf_serve.container.metrics.derive import HOP_OUTPUT_TOKENS

    assert HOP_OUTPUT_TOKENS == hop_names.OUTPUT_TOKENS
    hop = RequestMetrics()
    prev = parse_prometheus(metrics_text() + hop.exposition())
    for predicted, status in ((120, 200), (80, 200), (500, 500)):  # a failed answer's tokens are not served
        record = RequestRecord(0.0)
        record.status, record.finished, record.timings = status, 1.0, {"predicted_n": predicted}
        hop.observe(record)
    got = as_dict(derive(prev, parse_prometheus(metrics_text() + hop.exposition()), 60.0))
    assert got[names.OUTPUT_TOKENS] == (200, "Count")
