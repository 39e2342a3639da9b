"""What a scaler may change, enforced by the cluster: a ValidatingAdmissionPolicy on every pod update a scaler makes.

A scaler needs `patch` on pods for one thing, the pod-deletion-cost annotation of its own profile's pods
(gguf_serve/container/kube/scaler.py). RBAC cannot narrow `patch` to a field, and a pod's container images are
mutable: a scaler with plain `patch` could run any image in any serving pod of the namespace, with that pod's IAM
role (the model cache, the key's secret). This policy denies a scaler's pod update unless the pod is of the scaler's
own profile and nothing but that annotation differs: spec, labels, other annotations, owners and finalizers stay.

ValidatingAdmissionPolicy is GA in Kubernetes 1.30 (admissionregistration.k8s.io/v1; Kubernetes docs, "Validating
Admission Policy"), so on the cluster's 1.35. The expressions are CEL, which tests evaluate for real
(tests/stacks/eks/test_scaler_guard.py, with the cel-python interpreter) against admission requests.
"""

from __future__ import annotations

from typing import Any

from gguf_serve.container.kube.scaler import DELETION_COST
from stacks.eks.workload import NAMESPACE, PROFILE_LABEL

POLICY = "gguf-serve-scaler-pods"
SCALER_SUFFIX = "-scaler"  # a profile's scaler's service account: <profile>-scaler (stacks/eks/scaler_objects.py)
_USER = f"system:serviceaccount:{NAMESPACE}:"  # a service account's username (Kubernetes, "Authenticating")

# (name, CEL expression): bound as variables.<name> before the validations run
VARIABLES = (
    ("oldLabels", "has(oldObject.metadata.labels) ? oldObject.metadata.labels : {}"),
    ("newLabels", "has(object.metadata.labels) ? object.metadata.labels : {}"),
    ("oldAnnotations", "has(oldObject.metadata.annotations) ? oldObject.metadata.annotations : {}"),
    ("newAnnotations", "has(object.metadata.annotations) ? object.metadata.annotations : {}"),
)
MATCH = f"request.userInfo.username.startsWith('{_USER}') && request.userInfo.username.endsWith('{SCALER_SUFFIX}')"
# (CEL expression that must be true, the message when it is not)
VALIDATIONS = (
    (
        f"'{PROFILE_LABEL}' in variables.oldLabels && request.userInfo.username == "
        f"'{_USER}' + variables.oldLabels['{PROFILE_LABEL}'] + '{SCALER_SUFFIX}'",
        "a scaler updates its own profile's pods only",
    ),
    ("object.spec == oldObject.spec", "a scaler never changes a pod's spec (its images, its commands)"),
    ("variables.newLabels == variables.oldLabels", "a scaler never changes a pod's labels"),
    (
        f"variables.newAnnotations.all(k, k == '{DELETION_COST}' || (k in variables.oldAnnotations && "
        f"variables.oldAnnotations[k] == variables.newAnnotations[k])) && "
        f"variables.oldAnnotations.all(k, k == '{DELETION_COST}' || k in variables.newAnnotations)",
        f"a scaler changes no annotation but {DELETION_COST}",
    ),
    (
        "(has(object.metadata.ownerReferences) ? object.metadata.ownerReferences : []) == "
        "(has(oldObject.metadata.ownerReferences) ? oldObject.metadata.ownerReferences : []) && "
        "(has(object.metadata.finalizers) ? object.metadata.finalizers : []) == "
        "(has(oldObject.metadata.finalizers) ? oldObject.metadata.finalizers : [])",
        "a scaler never changes a pod's owners or finalizers",
    ),
)


def scaler_guard_objects() -> list[dict[str, Any]]:
    """The policy and its binding (cluster-scoped, one for every profile's scaler), Deny on a failed validation."""
    policy = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": POLICY},
        "spec": {
            "failurePolicy": "Fail",  # an expression that cannot be evaluated denies, never admits
            "matchConstraints": {
                "resourceRules": [
                    {"apiGroups": [""], "apiVersions": ["v1"], "operations": ["UPDATE"], "resources": ["pods"]}
                ]
            },
            "matchConditions": [{"name": "a-gguf-serve-scaler", "expression": MATCH}],
            "variables": [{"name": n, "expression": e} for n, e in VARIABLES],
            "validations": [{"expression": e, "message": m} for e, m in VALIDATIONS],
        },
    }
    binding = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": POLICY},
        "spec": {
            "policyName": POLICY,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": NAMESPACE}}},
        },
    }
    return [policy, binding]
