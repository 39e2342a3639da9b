"""server.queue_per_slot: the hop's admission setting, from the profile through the runtime spec (issue 21)."""

from __future__ import annotations

import json

import pytest

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError
from tests.committed import local_profile


def test_the_default_stays_out_of_the_spec_and_a_setting_goes_in():
    p = local_profile()
    assert p.server.queue_per_slot == 4
    assert "queue_per_slot" not in json.loads(p.runtime_json())["server"]  # older specs stay byte-identical
    spec = RuntimeSpec.from_json(p.with_server(queue_per_slot=0).runtime_json())
    assert spec.server.queue_per_slot == 0 and spec.server.parallel == p.server.parallel


@pytest.mark.parametrize("value", [-1, 257])
def test_out_of_range_is_refused_by_the_profile_and_the_spec(value: int):
    p = local_profile()
    with pytest.raises(ProfileError, match="queue_per_slot"):
        p.with_server(queue_per_slot=value)
    doc = json.loads(p.runtime_json())
    doc["server"]["queue_per_slot"] = value
    with pytest.raises(RuntimeSpecError, match="queue_per_slot"):
        RuntimeSpec.from_json(json.dumps(doc))


def test_the_hop_reads_it_from_the_spec(tmp_path):
    from gguf_serve.container.hop.cli import _admission, build_parser

    spec = tmp_path / "runtime.json"
    spec.write_text(local_profile().with_server(parallel=3, queue_per_slot=2).runtime_json())
    admission = _admission(build_parser().parse_args(["--spec", str(spec)]))
    assert (admission.slots, admission.limit) == (3, 9)
    assert _admission(build_parser().parse_args(["--spec", str(spec), "--queue-per-slot", "0"])).limit == 3
    assert _admission(build_parser().parse_args([])).limit is None  # no spec, no setting: never sheds
