"""A second policy scanner beyond cdk-nag: checkov's CloudFormation checks on the synthesized templates."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from stacks.checkov import ACCEPTED
from tests.conftest import ROOT

CHECKOV = ROOT / ".venv-checkov" / "bin" / "checkov"


def _checkov(directory: Path) -> list[dict]:
    if not CHECKOV.exists():
        pytest.fail(f"{CHECKOV} is missing: `make test` installs it from requirements-checkov.txt")
    out = subprocess.run(
        [str(CHECKOV), "-d", str(directory), "--framework", "cloudformation", "--quiet", "--compact", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=600,
        env={"PATH": "/usr/bin:/bin", "HOME": str(directory), "BC_SKIP_MAPPING": "TRUE"},
    )
    reports = json.loads(out.stdout or "[]")
    return reports if isinstance(reports, list) else [reports]


def _templates_dir(tmp_path: Path, files: list[Path]) -> Path:
    for i, f in enumerate(files):
        (tmp_path / f"{i:02d}-{f.name}").write_text(f.read_text())
    return tmp_path


@pytest.mark.scan
@pytest.mark.slow
def test_checkov_finds_nothing_unreasoned_in_any_whole_app_option_set(tmp_path, template_files, synthesized):
    files = [*template_files.values(), *(f for stacks in synthesized.values() for f in stacks.values())]
    reports = _checkov(_templates_dir(tmp_path, files))
    failed = [(f["check_id"], f["resource"], f["file_path"]) for r in reports for f in r["results"]["failed_checks"]]
    assert failed == []
    assert sum(r["summary"]["passed"] for r in reports) > 100 * len(files) // 10  # it really checked


def test_every_skip_carries_a_reason(template_files):
    for path in template_files.values():
        for rid, res in json.loads(path.read_text())["Resources"].items():
            for skip in res.get("Metadata", {}).get("checkov", {}).get("skip", []):
                assert skip["id"].startswith("CKV_") and len(skip["comment"]) >= 40, (rid, skip)


@pytest.mark.scan
def test_checkov_is_real_without_the_reasons(tmp_path, synthesized, template_files):
    """Negative control: strip the accepted findings and checkov reports them, one kind per rule (the wake door's
    function exists only with wakeOnRequest, the SageMaker execution role only in a SageMaker stack)."""
    for name, path in (
        ("bare", synthesized["ningxia-from-zero"]["GravitonMoeStack"]),
        ("bare-sagemaker", template_files["GravitonMoeSageMakerStack"]),
    ):
        doc = json.loads(path.read_text())
        for res in doc["Resources"].values():
            res.get("Metadata", {}).pop("checkov", None)
        (tmp_path / f"{name}.template.json").write_text(json.dumps(doc))
    reports = _checkov(tmp_path)
    found = {f["check_id"] for r in reports for f in r["results"]["failed_checks"]}
    accepted = {check for _, _, reasons in ACCEPTED for check in reasons}
    assert found == accepted


@pytest.mark.scan
@pytest.mark.slow
def test_checkov_finds_nothing_unreasoned_behind_a_shared_endpoint(tmp_path, shared_assembly):
    """SharedEndpointStack and the EC2 stacks behind it (tests/stacks/shared/)."""
    files = sorted(shared_assembly.glob("*Stack.template.json"))
    assert len(files) == 4
    reports = _checkov(_templates_dir(tmp_path, files))
    failed = [(f["check_id"], f["resource"], f["file_path"]) for r in reports for f in r["results"]["failed_checks"]]
    assert failed == []
    assert sum(r["summary"]["passed"] for r in reports) > 100 * len(files) // 10
