from __future__ import annotations

import json
import re
from pathlib import Path

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from catalog import PROFILES
from stacks.app import build_app
from tests.conftest import cdk_context

STACK_NAMES = [p.stack_name for p in PROFILES.values()]


@pytest.fixture(scope="session")
def app() -> cdk.App:
    return build_app(cdk_context())


@pytest.fixture(scope="session")
def assembly(app: cdk.App) -> cdk.cx_api.CloudAssembly:
    return app.synth()


@pytest.fixture(scope="session")
def templates(app: cdk.App) -> dict[str, Template]:
    return {name: Template.from_stack(app.node.find_child(name)) for name in STACK_NAMES}


@pytest.fixture(scope="session")
def template_files(assembly) -> dict[str, Path]:
    return {s.stack_name: Path(assembly.directory) / s.template_file for s in assembly.stacks}


def scrub(template: dict) -> dict:
    """Asset hashes change with any source edit; the snapshot is about structure."""
    text = json.dumps(template, indent=1, sort_keys=True)
    text = re.sub(r"[0-9a-f]{64}", "<asset-hash>", text)
    text = re.sub(r"(arm64-cpu|x86-64-cpu|cuda)-[0-9a-f]{16}", r"\1-<hash>", text)
    return json.loads(text)
