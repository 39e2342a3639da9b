"""parse_prometheus on real llama-server output and on the format's corners."""

from __future__ import annotations

import math

import pytest

from gguf_serve.container.metrics import parse_prometheus
from tests.container.metrics.conftest import COUNTERS, GAUGES, captured, metrics_text


def test_idle_capture_has_every_family_with_its_type_and_help():
    families = parse_prometheus(captured("metrics_idle.txt"))
    assert set(families) == {f"llamacpp:{n}" for n in COUNTERS + GAUGES}
    assert {n for n, f in families.items() if f.type == "counter"} == {f"llamacpp:{n}" for n in COUNTERS}
    assert {n for n, f in families.items() if f.type == "gauge"} == {f"llamacpp:{n}" for n in GAUGES}
    assert families["llamacpp:requests_deferred"].help == "Number of requests deferred"
    assert all(f.value() == 0 and len(f.samples) == 1 for f in families.values())


def test_capture_after_three_requests_reads_the_real_values():
    families = parse_prometheus(captured("metrics_after_requests.txt"))
    assert families["llamacpp:tokens_predicted_total"].value() == 600
    assert families["llamacpp:prompt_tokens_total"].value() == 67
    assert families["llamacpp:prompt_tokens_cached_total"].value() == 26
    assert families["llamacpp:prompt_seconds_total"].value() == pytest.approx(4.06337)
    assert families["llamacpp:n_busy_slots_per_decode"].value() == pytest.approx(1.50124)
    assert families["llamacpp:requests_processing"].value() == 0


def test_labelled_counter_per_draft_position():
    families = parse_prometheus(metrics_text(per_pos=[40, 25, 9]))
    family = families["llamacpp:spec_decode_num_accepted_tokens_per_pos_total"]
    assert family.type == "counter"
    assert [s.labels for s in family.samples] == [{"position": "0"}, {"position": "1"}, {"position": "2"}]
    assert family.value(position="1") == 25
    assert family.value() is None  # no unlabelled sample


def test_label_escapes_spacing_and_trailing_comma():
    text = 'm{path="C:\\\\dir",msg="say \\"hi\\"\\nbye" , empty="",} 1\n'
    (sample,) = parse_prometheus(text)["m"].samples
    assert sample.labels == {"path": "C:\\dir", "msg": 'say "hi"\nbye', "empty": ""}


def test_special_values_exponents_and_timestamps():
    families = parse_prometheus("a NaN\nb +Inf\nc -Inf\nd 1.5e3 1700000000000\ne -0.25\n")
    assert math.isnan(families["a"].value())
    assert families["b"].value() == math.inf and families["c"].value() == -math.inf
    assert families["d"].value() == 1500 and families["d"].samples[0].timestamp_ms == 1700000000000
    assert families["e"].value() == -0.25


def test_comments_blank_lines_crlf_and_untyped():
    text = "# a free comment\r\n\r\n# HELP x Escaped \\\\ and \\n in help\r\nx 3\r\n#TYPE\r\ny 4\r\n"
    families = parse_prometheus(text)
    assert families["x"].help == "Escaped \\ and \n in help"
    assert families["x"].type == "untyped" and families["x"].value() == 3
    assert families["y"].value() == 4


def test_histogram_samples_join_their_family():
    text = (
        "# TYPE lat histogram\n"
        'lat_bucket{le="0.5"} 2\nlat_bucket{le="+Inf"} 3\nlat_sum 1.2\nlat_count 3\n'
        "# TYPE other_count counter\nother_count 7\n"
    )
    families = parse_prometheus(text)
    assert [s.name for s in families["lat"].samples] == ["lat_bucket", "lat_bucket", "lat_sum", "lat_count"]
    assert families["other_count"].value() == 7
    assert set(families) == {"lat", "other_count"}


@pytest.mark.parametrize(
    "line",
    [
        'foo{a="b" 1',
        'foo{a="b} 1',
        "foo{a=b} 1",
        'foo{a="1",a="2"} 1',
        "foo abc",
        "foo 1_000",
        "foo 1 2 3",
        "foo 1 notatimestamp",
        "foo",
        '{a="b"} 1',
        "# TYPE foo wrongtype",
        "# TYPE 9bad counter",
    ],
)
def test_malformed_lines_name_the_line(line):
    with pytest.raises(ValueError, match=r"^line 2: "):
        parse_prometheus("ok 1\n" + line + "\n")
