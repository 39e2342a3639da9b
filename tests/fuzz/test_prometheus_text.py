"""Any /metrics body ends in families or one ValueError naming the line (the metrics publisher logs it and goes on)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from gguf_serve.container.metrics.prometheus import MetricFamily, parse_prometheus

PIECES = st.sampled_from(
    ["# HELP ", "# TYPE ", "llamacpp:requests_processing", "_bucket", "_count", "{", "}", '="', '"', ",", "=",
     " ", "\t", "\\", "\\n", "\\\"", "\n", "1", "-1.5e3", "NaN", "+Inf", "1_0", "counter", "gauge", "histogram",
     "le", "position", "\x00", "\u00e9", "17e308"]
)  # fmt: skip
LINES = st.lists(PIECES, max_size=30).map("".join)


@given(st.one_of(st.text(max_size=2000), LINES))
def test_any_text_parses_or_raises_value_error(text: str) -> None:
    try:
        families = parse_prometheus(text)
    except ValueError as e:
        assert str(e).startswith("line ")
        return
    assert all(isinstance(f, MetricFamily) for f in families.values())
    for family in families.values():
        for sample in family.samples:
            assert isinstance(sample.value, float) and isinstance(sample.labels, dict)
