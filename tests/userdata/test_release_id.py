"""The release id covers every value the boot template reads: each one changed alone changes the id; a price or
a description edit (which the template does not read) leaves it as it was."""

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
from userdata.render import TEMPLATE, BootSettings, release_id, template_context

TAG = "x86-64-cpu-0123456789abcdef"
SOURCE = (Path(render.__file__).parent / "templates" / TEMPLATE).read_text()
BASE = PROFILES["intel-moe"]
# The template's own variables; a new one fails test_every_template_variable_is_covered until it is added here.
COVERED = {"p", "boot", "n", "runtime_spec_b64", "gpu", "port", "refusal_exit"}


def _changed(value: object) -> object:
    if isinstance(value, bool):
        return not value
    if isinstance(value, int):
        return value + 1
    if isinstance(value, str):
        return value + "x"
    raise TypeError(value)


def _with(obj: object, path: list[str]) -> object:
    """obj with the value at path (e.g. ["fleet", "model_load_s"]) changed: a field through dataclasses.replace, a
    derived value (a property such as fleet.drain_deadline_s) through a subclass that answers the changed value."""
    head, *rest = path
    new = _with(getattr(obj, head), rest) if rest else _changed(getattr(obj, head))
    if head in {f.name for f in fields(obj)}:
        return replace(obj, **{head: new})
    derived = type(type(obj).__name__, (type(obj),), {head: property(lambda _self: new)})
    return derived(**{f.name: getattr(obj, f.name) for f in fields(obj) if f.init})


def _profile_paths() -> list[str]:
    return sorted(set(re.findall(r"\bp\.([a-z_]+(?:\.[a-z_]+)*)", SOURCE)))


def test_every_template_variable_is_covered():
    env = jinja2.Environment(autoescape=False)  # noqa: S701 - shell, not HTML
    assert jinja2.meta.find_undeclared_variables(env.parse(SOURCE)) == COVERED
    assert set(template_context(BASE, BootSettings(**{f.name: "" for f in fields(BootSettings)}))) == COVERED
    assert {"fleet.model_load_s", "server.parallel", "model.file"} <= set(_profile_paths())


@pytest.mark.parametrize("path", _profile_paths())
def test_each_profile_value_the_template_reads_changes_the_id(path):
    assert release_id(_with(BASE, path.split(".")), TAG) != release_id(BASE, TAG)


def test_the_runtime_spec_and_the_port_change_the_id():
    assert release_id(BASE.with_server(ctx_per_slot=16384), TAG) != release_id(BASE, TAG)
    assert release_id(BASE.with_server(port=9090), TAG) != release_id(BASE, TAG)


@pytest.mark.parametrize("key", sorted(COVERED - {"p", "boot"}))
def test_each_other_template_value_changes_the_id(key, monkeypatch):
    """gpu, port, the runtime spec, the refusal exit code, the shared names: each changed alone."""
    real = render.template_context
    base = release_id(BASE, TAG)

    def one_changed(profile, boot):
        ctx = real(profile, boot)
        if key == "n":
            ctx["n"] = SimpleNamespace(**{**vars(render.names), "SERVER_UNIT": "another-unit"})
        elif key == "runtime_spec_b64":
            ctx[key] = real(profile.with_server(ctx_per_slot=16384), boot)[key]
        else:
            ctx[key] = _changed(ctx[key])
        return ctx

    monkeypatch.setattr(render, "template_context", one_changed)
    assert release_id(BASE, TAG) != base


def test_the_image_changes_the_id():
    assert release_id(BASE, "x86-64-cpu-fedcba9876543210") != release_id(BASE, TAG)


def test_a_price_or_a_description_leaves_the_id():
    hw = replace(BASE.hardware, ri_1yr_all_upfront_cny=1.0, on_demand_cny_per_hour=0.5, price_is_estimate=True)
    assert release_id(replace(BASE, description="cheaper now", hardware=hw), TAG) == release_id(BASE, TAG)


def test_deploy_time_values_stay_out_of_the_id():
    """The tokens of BootSettings render as fixed placeholders: the id does not depend on token numbering."""
    text = render._render(BASE, render._FIXED_BOOT)
    assert "<image_uri>" in text and "${Token[" not in text
