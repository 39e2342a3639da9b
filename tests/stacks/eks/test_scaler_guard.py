"""The scaler guard's CEL (stacks/eks/scaler_guard.py), evaluated by a real CEL interpreter (cel-python) the way the
API server evaluates a ValidatingAdmissionPolicy: the match condition on the request, the variables, then each
validation on the admission request's `object` and `oldObject`. A scaler may set the deletion cost of its own
profile's pods and nothing else: not an image, a command, a label, another annotation, another profile's pod."""

from __future__ import annotations

import copy
from typing import Any

import celpy
import kubernetes_validate
import pytest

from gguf_serve.container.kube.scaler import DELETION_COST
from stacks.eks.cluster import KUBERNETES_MINOR
from stacks.eks.scaler_guard import MATCH, VALIDATIONS, VARIABLES, scaler_guard_objects
from tests.stacks.eks.conftest import kube_objects

ENV = celpy.Environment()
SCALER = "system:serviceaccount:gguf-serve:graviton-moe-scaler"


def _program(expression: str) -> Any:
    return ENV.program(ENV.compile(expression))


def admitted(user: str, new: dict[str, Any], old: dict[str, Any]) -> tuple[bool, list[str]]:
    """(whether the policy applies, the messages of the validations that fail) for one UPDATE of a pod."""
    activation: dict[str, Any] = {
        "request": celpy.json_to_cel({"userInfo": {"username": user}}),
        "object": celpy.json_to_cel(new),
        "oldObject": celpy.json_to_cel(old),
    }
    if not _program(MATCH).evaluate(activation):
        return False, []
    activation["variables"] = celpy.json_to_cel({})
    bound: dict[str, Any] = {}
    for name, expression in VARIABLES:
        bound[name] = _program(expression).evaluate(activation)
    activation["variables"] = celpy.celtypes.MapType({celpy.celtypes.StringType(k): v for k, v in bound.items()})
    failed = []
    for expression, message in VALIDATIONS:
        result = _program(expression).evaluate(activation)
        if isinstance(result, Exception) or not bool(result):
            failed.append(message)
    return True, failed


def _pod(profile: str = "graviton-moe") -> dict[str, Any]:
    return {
        "metadata": {
            "name": f"{profile}-7d9f-abcde",
            "labels": {"app.kubernetes.io/name": "gguf-serve", "gguf-serve/profile": profile},
            "annotations": {"kubectl.kubernetes.io/restartedAt": "2026-12-01T00:00:00Z"},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": f"{profile}-7d9f", "uid": "u"}],
        },
        "spec": {"containers": [{"name": "hop", "image": "123456789012.dkr.ecr.cn-northwest-1.amazonaws.com.cn/x:1"}]},
    }


def _changed(change) -> dict[str, Any]:
    pod = copy.deepcopy(_pod())
    change(pod)
    return pod


def test_a_scaler_may_set_its_own_pods_deletion_cost():
    new = _changed(lambda p: p["metadata"]["annotations"].update({DELETION_COST: "3"}))
    assert admitted(SCALER, new, _pod()) == (True, [])
    bare = _pod()
    del bare["metadata"]["annotations"]  # a pod with no annotation yet
    assert admitted(SCALER, _changed(lambda p: p["metadata"].update(annotations={DELETION_COST: "0"})), bare)[1] == []


@pytest.mark.parametrize(
    "change, refused",
    [
        (lambda p: p["spec"]["containers"][0].update(image="attacker.example/miner:latest"), "spec"),
        (lambda p: p["spec"]["containers"][0].update(command=["sh", "-c", "curl ..."]), "spec"),
        (lambda p: p["metadata"]["labels"].update({"gguf-serve/profile": "gpu-mtp"}), "labels"),
        (lambda p: p["metadata"]["labels"].pop("app.kubernetes.io/name"), "labels"),
        (lambda p: p["metadata"]["annotations"].update({"other": "x"}), "annotation"),
        (lambda p: p["metadata"].pop("annotations"), "annotation"),
        (lambda p: p["metadata"].update(finalizers=["example.com/hold"]), "finalizers"),
        (lambda p: p["metadata"].pop("ownerReferences"), "owners"),
    ],
)
def test_anything_else_a_scaler_changes_in_a_pod_is_denied(change, refused):
    applies, failed = admitted(SCALER, _changed(change), _pod())
    assert applies and failed and any(refused in m for m in failed), failed


def test_a_scaler_may_not_touch_another_profiles_pod():
    other = _pod("gpu-mtp")
    new = copy.deepcopy(other)
    new["metadata"]["annotations"][DELETION_COST] = "0"
    applies, failed = admitted(SCALER, new, other)
    assert applies and failed == ["a scaler updates its own profile's pods only"]


def test_the_policy_applies_to_scalers_only():
    changed = _changed(lambda p: p["spec"]["containers"][0].update(image="x"))
    assert admitted("system:serviceaccount:gguf-serve:graviton-moe", changed, _pod()) == (False, [])
    assert admitted("kubernetes-admin", changed, _pod()) == (False, [])


def test_the_objects_are_valid_and_the_stack_applies_them(eks_template):
    objects = scaler_guard_objects()
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_MINOR, strict=True)
    applied = [o for o in kube_objects(eks_template) if o["kind"].startswith("ValidatingAdmissionPolicy")]
    assert [(o["kind"], o["metadata"]["name"], o["spec"]) for o in applied] == [
        (o["kind"], o["metadata"]["name"], o["spec"]) for o in objects
    ]  # as written (CDK adds its prune label)
    binding = objects[1]["spec"]
    assert binding["validationActions"] == ["Deny"] and objects[0]["spec"]["failurePolicy"] == "Fail"
