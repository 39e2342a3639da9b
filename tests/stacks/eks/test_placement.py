"""Every pod can run where it can be scheduled: for each workload the stack applies, the node groups it may land on
(its node selector against each group's labels, its tolerations against each group's taints, as the scheduler reads
them) and the architecture of its image (the image target in its tag) against each group's (its AMI type). The
negative controls are the regression this guards: a scaler running its profile's x86-64 or CUDA image with no
selector, which the scheduler puts on the arm64 system nodes, where it dies with `exec format error`."""

from __future__ import annotations

from typing import Any

import pytest

from gguf_serve.catalog.images import IMAGE_TARGETS
from stacks.eks.cluster import ARCH_LABEL, kube_arch
from tests.stacks.eks.conftest import PROFILES, kube_objects, resources


def node_groups(template: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Logical id -> the labels a node of the group carries (its own and kubernetes.io/arch) and its taints."""
    out = {}
    for logical, group in resources(template, "AWS::EKS::Nodegroup").items():
        arch = "arm64" if "ARM_64" in group["AmiType"] else "amd64"  # every AMI type either says ARM_64 or is x86-64
        out[logical] = {
            "labels": {**group.get("Labels", {}), ARCH_LABEL: arch},
            "taints": group.get("Taints", []),
            "arch": arch,
        }
    return out


def image_arch(image: str) -> str:
    """The architecture of an image the stack builds, from its tag (stacks/image_build.py: <target>-<key>)."""
    tag = image.rsplit(":", 1)[1]
    [target] = [t for name, t in IMAGE_TARGETS.items() if tag.startswith(f"{name}-")]
    return kube_arch(target.architecture)


def _tolerates(tolerations: list[dict[str, Any]], taint: dict[str, Any]) -> bool:
    effect = {"NO_SCHEDULE": "NoSchedule", "NO_EXECUTE": "NoExecute", "PREFER_NO_SCHEDULE": "PreferNoSchedule"}
    for t in tolerations:
        if t.get("effect") not in (None, effect[taint["Effect"]]) or t.get("key") not in (None, taint["Key"]):
            continue
        if t.get("operator") == "Exists" or t.get("value") == taint.get("Value"):
            return True
    return False


def landing(pod: dict[str, Any], groups: dict[str, dict[str, Any]]) -> list[str]:
    """The node groups the scheduler may put the pod on (hard constraints only: a PreferNoSchedule taint allows)."""
    selector = pod.get("nodeSelector", {})
    affinity = pod.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    assert affinity is None, "read node affinity here before the stack uses it"
    out = []
    for logical, g in groups.items():
        if any(g["labels"].get(k) != v for k, v in selector.items()):
            continue
        hard = [t for t in g["taints"] if t["Effect"] != "PREFER_NO_SCHEDULE"]
        if all(_tolerates(pod.get("tolerations", []), t) for t in hard):
            out.append(logical)
    return out


def misplaced(template: dict[str, Any], objects: list[dict[str, Any]]) -> list[str]:
    groups = node_groups(template)
    found = []
    for obj in objects:
        if obj["kind"] not in ("Deployment", "DaemonSet", "StatefulSet", "Job"):
            continue
        pod = obj["spec"]["template"]["spec"]
        name = obj["metadata"]["name"]
        where = landing(pod, groups)
        if not where:
            found.append(f"{name}: no node group can take it")
        for c in [*pod.get("initContainers", []), *pod["containers"]]:
            arch = image_arch(c["image"])
            wrong = [g for g in where if groups[g]["arch"] != arch]
            if wrong:
                found.append(f"{name}/{c['name']}: a {arch} image, schedulable on {wrong} ({groups[wrong[0]]['arch']})")
    return found


def test_every_workload_runs_an_image_of_every_node_group_it_may_land_on(eks_template):
    objects = kube_objects(eks_template)
    workloads = [o for o in objects if o["kind"] == "Deployment"]
    assert len(workloads) == 2 * len(PROFILES)  # each profile's serving pods and its scaler
    assert misplaced(eks_template, objects) == []


def test_each_scaler_lands_on_the_system_nodes_only_and_serving_pods_on_their_own_group(eks_template):
    groups = node_groups(eks_template)
    system = [g for g, v in groups.items() if v["labels"].get("gguf-serve/role") == "system"]
    for obj in kube_objects(eks_template):
        if obj["kind"] != "Deployment":
            continue
        where = landing(obj["spec"]["template"]["spec"], groups)
        if obj["metadata"]["name"].endswith("-scaler"):
            assert where == system
        else:
            [group] = where
            assert groups[group]["labels"]["gguf-serve/profile"] == obj["metadata"]["name"]


@pytest.mark.parametrize("profile", ["intel-moe", "gpu-mtp"])
def test_negative_control_a_scaler_on_its_profiles_image_without_a_selector_is_found(eks_template, profile):
    objects = kube_objects(eks_template)
    serving = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == profile)
    scaler = next(o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"] == f"{profile}-scaler")
    pod = scaler["spec"]["template"]["spec"]
    pod.pop("nodeSelector")  # the scaler as it was: no selector ...
    for c in [*pod["initContainers"], *pod["containers"]]:  # ... running its own profile's image
        c["image"] = serving["spec"]["template"]["spec"]["containers"][0]["image"]
    found = misplaced(eks_template, [scaler])
    assert any("amd64 image, schedulable on" in f and "(arm64)" in f for f in found), found
