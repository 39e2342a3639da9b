"""What EksServingStack's synthesis is made of (its fixtures, `eks_assembly` and `eks_template`, are in
tests/stacks/conftest.py, defined once for every test that reads them): three profiles (a Graviton CPU one, the Intel
one and the GPU one: all three image architectures on one cluster), with an admin role, an allowed network and a
certificate."""

from __future__ import annotations

import json
import re
from typing import Any

from tests.whole_app import CERT

ADMIN = "arn:aws-cn:iam::111122223333:role/platform-admins"
PROFILES = ("graviton-moe", "intel-moe", "gpu-mtp")  # arm64, x86-64 and CUDA images on one cluster
CONTEXT = {
    "eksProfiles": ",".join(PROFILES),
    "eksAdminRoles": ADMIN,
    "allowedCidrs": "10.8.0.0/16",
    "certificateArn": CERT,
}


def resources(template: dict[str, Any], kind: str) -> dict[str, dict[str, Any]]:
    return {k: v["Properties"] for k, v in template["Resources"].items() if v["Type"] == kind}


def flat(value: Any) -> str:
    """A template value as text, each reference as <Name> (what the manifests look like before deploy)."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and "Fn::Join" in value:
        return value["Fn::Join"][0].join(flat(v) for v in value["Fn::Join"][1])
    if isinstance(value, dict) and "Ref" in value:
        return f"<{value['Ref']}>"
    if isinstance(value, dict) and "Fn::GetAtt" in value:
        return "<{}.{}>".format(*value["Fn::GetAtt"])
    if isinstance(value, dict) and "Fn::Select" in value:
        return f"<select:{flat(value['Fn::Select'][1])}>"
    if isinstance(value, dict) and "Fn::Split" in value:
        return f"<split:{flat(value['Fn::Split'][1])}>"
    if isinstance(value, dict) and "Fn::ImportValue" in value:  # another stack's export (a shared endpoint's)
        return f"<import:{value['Fn::ImportValue']}>"
    raise AssertionError(f"unexpected intrinsic {value}")


def kube_objects(template: dict[str, Any]) -> list[dict[str, Any]]:
    """Every Kubernetes object the stack applies (its own and CDK's service accounts), references as <Name>."""
    out = []
    for props in resources(template, "Custom::AWSCDK-EKS-KubernetesResource").values():
        text = flat(props["Manifest"])
        out += json.loads(re.sub(r"[\x00-\x1f]", " ", text))
    return out
