"""Whole-app guards: China partition, no lookups, cdk-nag, cfn-lint (the snapshots: test_snapshots.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from stacks.app import build_app
from stacks.lambda_runtimes import CHINA_DOCUMENTED, PYTHON
from stacks.options import DeployOptionError
from tests.conftest import ROOT, cdk_context
from tests.stacks.conftest import STACK_NAMES
from tests.whole_app import OPTION_SETS


def _strings(node, path=()):
    if isinstance(node, dict):
        for k, v in node.items():
            yield from _strings(v, (*path, k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _strings(v, (*path, i))
    elif isinstance(node, str):
        yield path, node


@pytest.mark.parametrize("stack", STACK_NAMES)
def test_template_is_china_ready_and_lookup_free(templates, stack):
    doc = templates[stack].to_json()
    for path, value in _strings(doc):
        where = "/".join(map(str, path))
        assert "dummy" not in value, where
        assert "${Token[" not in value, where
        assert "arn:aws:" not in value, where
        if "amazonaws.com" in value:
            # Service principals (CDK emits these for China too) and VPC endpoint service names only.
            assert "Principal" in path or "ServiceName" in where, f"{where}: {value}"
    subnets = templates[stack].find_resources("AWS::EC2::Subnet")
    zones = {s["Properties"]["AvailabilityZone"] for s in subnets.values()}
    assert zones <= set(cdk_context()["pinned-availability-zones"]["cn-northwest-1"])
    assert len(zones) == 2


def test_every_lambda_runtime_is_one_china_documents(templates):
    """Ours and the one CDK picks for its own handlers (an aws-cdk-lib upgrade that moves it fails here first)."""
    runtimes = {
        name: r["Properties"]["Runtime"]
        for stack in STACK_NAMES
        for name, r in templates[stack].find_resources("AWS::Lambda::Function").items()
    }
    assert set(runtimes.values()) - CHINA_DOCUMENTED == set(), runtimes
    assert {"nodejs24.x", PYTHON.name} <= set(runtimes.values())  # the provider framework's and ours


def test_cn_north_1_synthesizes_too(whole_apps):
    beijing = whole_apps["beijing-cost-saver"]
    manifest = json.loads((beijing.directory / "manifest.json").read_text())
    assert manifest["artifacts"]["GravitonMoeStack"]["environment"] == "aws://111122223333/cn-north-1"
    text = json.dumps(beijing.template("GravitonMoeStack"))
    assert "cn-north-1a" in text and "cn-northwest-1" not in text and "dummy" not in text


def test_unpinned_region_fails_with_what_to_change():
    with pytest.raises(DeployOptionError, match="pinned-availability-zones"):
        build_app({**cdk_context(), "region": "cn-south-9"})


def test_cdk_nag_has_no_unacknowledged_findings_and_every_acknowledgement_has_a_reason(committed):
    """The committed app synthesized with cdk-nag's plugin (build_app adds it), which fails synth on a finding
    (test_deploy_options.py::test_the_cdk_nag_plugin_is_in_the_path); the acknowledgements are in the assembly."""
    acks = [
        (path, rule, reason)
        for stack in STACK_NAMES
        for path, entries in committed.metadata(stack).items()
        for m in entries
        if m["type"] == "aws:cdk:acknowledged-rules"
        for rule, reason in m["data"].items()
    ]
    assert len(acks) > 5 * len(STACK_NAMES)
    for path, rule, reason in acks:
        assert len(reason) >= 30, f"{path} {rule}: acknowledgement needs a real reason"
    assert not [
        m for s in STACK_NAMES for e in committed.metadata(s).values() for m in e if m["type"] == "aws:cdk:error"
    ]


@pytest.mark.parametrize("option_set", sorted(OPTION_SETS))
def test_no_option_set_synthesizes_with_an_unacknowledged_warning(whole_apps, option_set):
    """What `cdk synth` and `cdk deploy` would print a user as a WARNING (a dashboard's metric period overridden, a
    deprecated property): none, in any stack of any option set; an acknowledged one is no longer a warning."""
    synthesized = whole_apps[option_set]
    warnings = [
        f"{stack}{path}: {m['data']}"
        for stack in synthesized.stacks
        for path, entries in synthesized.metadata(stack).items()
        for m in entries
        if m["type"] == "aws:cdk:warning"
    ]
    assert warnings == []


@pytest.mark.scan
@pytest.mark.slow
def test_cfn_lint_cn_northwest_1_has_zero_findings(template_files):
    out = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--config-file", str(ROOT / ".cfnlintrc.yaml"), "--",
         *map(str, template_files.values())],
        capture_output=True,
        text=True,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.scan
def test_cfn_lint_catches_an_instance_type_absent_from_ningxia(tmp_path, template_files):
    """The lint is real: a type that does not exist in cn-northwest-1 fails."""
    doc = json.loads(template_files["GravitonMoeStack"].read_text())
    for res in doc["Resources"].values():
        if res["Type"] == "AWS::EC2::LaunchTemplate":
            res["Properties"]["LaunchTemplateData"]["InstanceType"] = "p5.48xlarge"
    bad = tmp_path / "bad.template.json"
    bad.write_text(json.dumps(doc))
    out = subprocess.run(
        [str(Path(sys.executable).parent / "cfn-lint"), "--config-file", str(ROOT / ".cfnlintrc.yaml"), "--", str(bad)],
        capture_output=True,
        text=True,
    )
    assert out.returncode != 0 and "E3628" in out.stdout
