"""Any file-list answer ends in well-typed entries or one FetchError naming what is wrong (never KeyError)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from gguf_serve.container.fetch.errors import FetchError
from gguf_serve.container.fetch.modelscope import parse_listing

SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=True), st.text(max_size=80),
    st.sampled_from(["blob", "tree", "a" * 64, "G" * 64, "-1", "123", "model.gguf"]),
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=10), inner, max_size=5)),
    max_leaves=30,
)
ENTRY = st.fixed_dictionaries(
    {},
    optional={"Path": SCALARS, "Size": SCALARS, "Sha256": SCALARS, "Type": SCALARS, "Name": SCALARS},
)
LISTING = st.one_of(
    JSON,
    st.builds(lambda files: {"Code": 200, "Data": {"Files": files}, "Success": True}, st.lists(ENTRY, max_size=6)),
    st.builds(lambda files: {"Data": files}, st.one_of(st.lists(ENTRY, max_size=6), JSON)),
)


@given(LISTING)
def test_any_listing_parses_or_is_refused(body: object) -> None:
    try:
        files = parse_listing(body, where="the file list")
    except FetchError as e:
        assert str(e).startswith("the file list")
        return
    for path, f in files.items():
        assert isinstance(path, str) and path == f.path
        assert isinstance(f.size, int) and f.size >= 0 and not isinstance(f.size, bool)
        assert f.sha256 is None or re.fullmatch("[0-9a-f]{64}", f.sha256)
