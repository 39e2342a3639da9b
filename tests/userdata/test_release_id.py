"""The release id covers every value the boot template reads: each one changed alone changes the id; a price or
a description edit (which never reaches the InstanceSpec) leaves it as it was."""

from __future__ import annotations

import re
from dataclasses import fields, replace
from pathlib import Path
from types import SimpleNamespace

import jinja2
import jinja2.meta
import pytest

import userdata.render as render
from tests.committed import PROFILES
from userdata.render import TEMPLATE, BootSettings, InstanceSpec, release_id, template_context

TAG = "x86-64-cpu-0123456789abcdef"
SOURCE = (Path(render.__file__).parent / "templates" / TEMPLATE).read_text()
PROFILE = PROFILES["intel-moe"]
BASE = InstanceSpec.of(PROFILE)
# The template's own variables; a new one fails test_every_template_variable_is_covered until it is added here.
COVERED = {"i", "boot", "n", "runtime_spec_b64", "refusal_exit"}
SPEC_FIELDS = [f.name for f in fields(InstanceSpec)]


def _changed(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    if isinstance(value, tuple):  # the models routed elsewhere (a shared endpoint)
        return (*value, "Qwen3.6-27B")
    raise TypeError(value)


def test_every_template_variable_is_covered():
    assert jinja2.meta.find_undeclared_variables(render._ENV.parse(SOURCE)) == COVERED
    assert set(template_context(BASE, BootSettings(**{f.name: "" for f in fields(BootSettings)}))) == COVERED


def test_the_template_reads_every_field_of_the_spec_and_nothing_else_of_the_profile():
    read = set(re.findall(r"\bi\.([a-z_]+)", SOURCE))
    assert read | {"runtime_json"} == set(SPEC_FIELDS)  # runtime_json reaches it as runtime_spec_b64
    assert not re.search(r"\bp\.", SOURCE)


@pytest.mark.parametrize("field", SPEC_FIELDS)
def test_each_spec_value_changes_the_id(field):
    changed = replace(BASE, **{field: _changed(getattr(BASE, field))})
    assert release_id(changed, TAG) != release_id(BASE, TAG)


def test_the_runtime_spec_the_port_and_the_fleet_values_reach_the_id_from_the_profile():
    base = release_id(BASE, TAG)
    assert release_id(InstanceSpec.of(PROFILE.with_server(ctx_per_slot=16384)), TAG) != base
    assert release_id(InstanceSpec.of(PROFILE.with_server(port=9090)), TAG) != base
    slower = replace(PROFILE, fleet=PROFILE.fleet.changed(slowest_decode_tok_s=2.0))  # a derived value: the deadline
    assert release_id(InstanceSpec.of(slower), TAG) != base
    assert release_id(InstanceSpec.of(replace(PROFILE, fleet=PROFILE.fleet.changed(model_load_s=301))), TAG) != base


@pytest.mark.parametrize("key", sorted(COVERED - {"i", "boot"}))
def test_each_other_template_value_changes_the_id(key, monkeypatch):
    """The runtime spec's encoding, the refusal exit code, the shared names: each changed alone."""
    real = render.template_context
    base = release_id(BASE, TAG)

    def one_changed(instance, boot):
        ctx = real(instance, boot)
        if key == "n":
            ctx["n"] = SimpleNamespace(**{**vars(render.names), "SERVER_UNIT": "another-unit"})
        else:
            ctx[key] = _changed(ctx[key])
        return ctx

    monkeypatch.setattr(render, "template_context", one_changed)
    assert release_id(BASE, TAG) != base


def test_the_image_changes_the_id():
    assert release_id(BASE, "x86-64-cpu-fedcba9876543210") != release_id(BASE, TAG)


def test_a_price_or_a_description_leaves_the_id():
    hw = replace(PROFILE.hardware, ri_1yr_all_upfront_cny=1.0, on_demand_cny_per_hour=0.5, price_is_estimate=True)
    edited = replace(PROFILE, description="cheaper now", hardware=hw)
    assert InstanceSpec.of(edited) == BASE
    assert release_id(InstanceSpec.of(edited), TAG) == release_id(BASE, TAG)


def test_deploy_time_values_stay_out_of_the_id():
    """The tokens of BootSettings render as fixed placeholders: the id does not depend on token numbering."""
    text = render._render(BASE, render._FIXED_BOOT)
    assert "<image_uri>" in text and "${Token[" not in text
