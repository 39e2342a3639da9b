"""One CodeBuild run as a CloudFormation step (stacks/build_step.py), as the image build and the SageMaker model's
staging use it: the completion handler the template carries is the one in stacks/handlers, and a failed build fails
the step with what it was and where its log says why."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

import aws_cdk as cdk
import pytest
from aws_cdk import aws_codebuild as codebuild
from aws_cdk.assertions import Template

from stacks.build_step import HANDLERS, build_step_provider


def _complete_handler(template: Template) -> tuple[str, dict[str, str]]:
    """The inline code and environment of the step's completion function in the synthesized template."""
    functions = template.find_resources("AWS::Lambda::Function")
    (props,) = [
        f["Properties"] for f in functions.values() if "BUILD_WHAT" in f["Properties"].get("Environment", {}).get(
            "Variables", {})
    ]  # fmt: skip
    return props["Code"]["ZipFile"], props["Environment"]["Variables"]


def _load(source: str, name: str) -> ModuleType:
    path = Path(f"/nonexistent/{name}.py")
    spec = importlib.util.spec_from_loader(name, loader=None, origin=str(path))
    assert spec is not None
    module = importlib.util.module_from_spec(spec)
    exec(compile(source, str(path), "exec"), module.__dict__)  # noqa: S102 - the template's own inline code
    return module


class _Builds:
    """CodeBuild's BatchGetBuilds for one build in a given state (moto's builds always read SUCCEEDED)."""

    def __init__(self, status: str) -> None:
        self.status = status

    def batch_get_builds(self, ids: list[str]) -> dict:
        return {"builds": [{"id": ids[0], "buildStatus": self.status, "currentPhase": "BUILD"}]}


@pytest.fixture
def step(stack: cdk.Stack, monkeypatch: pytest.MonkeyPatch) -> tuple[ModuleType, dict[str, str], str]:
    project = codebuild.Project(
        stack, "Project", build_spec=codebuild.BuildSpec.from_object({"version": "0.2", "phases": {}})
    )
    build_step_provider(stack, project=project, start="model_staging_start.py", what="model staging",
                        look="its CodeBuild log says why")  # fmt: skip
    code, env = _complete_handler(Template.from_stack(stack))
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    return _load(code, "build_is_complete"), env, code


def test_the_template_carries_the_shared_completion_handler_and_names_the_step(step) -> None:
    module, env, code = step
    assert code == (HANDLERS / "build_is_complete.py").read_text()
    assert env == {"BUILD_WHAT": "model staging", "BUILD_LOOK": "its CodeBuild log says why"}
    assert module.handler({"RequestType": "Delete"}, None) == {"IsComplete": True}
    assert module.handler({"RequestType": "Create", "Data": {"BuildId": ""}}, None) == {"IsComplete": True}


@pytest.mark.parametrize(("status", "complete"), [("IN_PROGRESS", False), ("SUCCEEDED", True)])
def test_a_running_build_is_polled_and_a_finished_one_completes(step, monkeypatch, status, complete) -> None:
    module, _, _ = step
    monkeypatch.setattr(module.boto3, "client", lambda service: _Builds(status))
    assert module.handler({"RequestType": "Create", "Data": {"BuildId": "b:1"}}, None) == {"IsComplete": complete}


@pytest.mark.parametrize("status", ["FAILED", "FAULT", "TIMED_OUT", "STOPPED"])
def test_a_failed_build_fails_the_step_with_what_it_was_and_where_to_look(step, monkeypatch, status) -> None:
    module, _, _ = step
    monkeypatch.setattr(module.boto3, "client", lambda service: _Builds(status))
    with pytest.raises(RuntimeError, match=rf"^model staging b:1 ended {status}; its CodeBuild log says why$"):
        module.handler({"RequestType": "Update", "Data": {"BuildId": "b:1"}}, None)
