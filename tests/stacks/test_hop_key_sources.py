"""Every hop the product starts says where its key comes from (or, where another gate stands in front, which one):
one walk over every synthesized template of the three whole-app option sets and EksServingStack (the EC2 user data,
the EKS manifests), the workstation's compose file and native runner, against the hop's own KEY_SOURCES. A scan of
the product's sources finds every place that starts a hop, so a new one cannot be left out of the walk. SageMaker's
front runs the hop in-process with IAM as its gate (gguf_serve/container/sagemaker/serve.py; the refusal itself:
tests/container/hop/test_keyless.py). The negative controls take the key flag out of a real start and see it found.
"""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml

from gguf_serve.container.hop.cli import KEY_SOURCES
from gguf_serve.local.workstation import native
from tests.stacks.eks.conftest import flat, kube_objects
from tests.whole_app import OPTION_SETS

ROOT = Path(__file__).resolve().parents[2]
MODULE = "gguf_serve.container.hop"
COMPOSE = ROOT / "gguf_serve/local/workstation/observability/compose.yaml"
# Where the product starts a hop, and how this test reads each: a new file that starts one fails the scan below
# until it is read here too.
STARTS = {
    "userdata/templates/boot.sh.j2": "the EC2 user data, read from every synthesized launch template",
    "stacks/eks/manifests.py": "the EKS serving pods, read from EksServingStack's manifests",
    "gguf_serve/local/workstation/native.py": "native.hop_command",
    "gguf_serve/local/workstation/observability/compose.yaml": "the compose file's services",
}
_START = re.compile(r"""(-m["',\s]+gguf_serve\.container\.hop|gguf-serve-hop)(?![.\w-])""")


def missing_key_source(argv: list[str]) -> bool:
    return not any(a == flag or a.startswith(flag + "=") for a in argv for flag in KEY_SOURCES)


def shell_starts(script: str) -> list[list[str]]:
    """Each `python3 -m gguf_serve.container.hop ...` command in a shell script, continuation lines joined, as argv
    (from the module on)."""
    out = []
    for match in re.finditer(rf"-m {re.escape(MODULE)}(?![.\w])", script):
        rest = script[match.end() :]
        line = re.split(r"(?<!\\)\n", rest, maxsplit=1)[0].replace("\\\n", " ")
        out.append([MODULE, *shlex.split(line)])
    return out


def manifest_starts(objects: list[dict[str, Any]]) -> list[list[str]]:
    """The command and args of each container (init containers too) that runs the hop module."""
    out = []

    def walk(node: Any) -> None:
        if isinstance(node, dict):
            argv = [*node.get("command", []), *node.get("args", [])] if "image" in node else []
            if MODULE in argv:
                out.append(argv)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(objects)
    return out


def template_starts(template: dict[str, Any]) -> list[list[str]]:
    starts = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::EC2::LaunchTemplate":
            continue
        user_data = resource["Properties"]["LaunchTemplateData"].get("UserData", {})  # EKS node groups': none
        if "Fn::Base64" in user_data:
            starts += shell_starts(flat(user_data["Fn::Base64"]))
    if any(r["Type"] == "Custom::AWSCDK-EKS-KubernetesResource" for r in template["Resources"].values()):
        starts += manifest_starts(kube_objects(template))
    return starts


def compose_starts(compose: dict[str, Any]) -> list[list[str]]:
    out = []
    for service in compose["services"].values():
        argv = [*service.get("entrypoint", []), *service.get("command", [])]
        if MODULE in argv:
            out.append(argv)
    return out


@pytest.mark.parametrize("option_set", list(OPTION_SETS))
def test_every_hop_in_the_whole_app_has_its_key_source(whole_apps, option_set):
    app = whole_apps[option_set]
    found = 0
    for stack in app.stacks:
        for argv in template_starts(app.template(stack)):
            assert not missing_key_source(argv), f"{stack}: the hop starts without a key source: {argv}"
            found += 1
    fleets = [s for s in app.stacks if "SageMaker" not in s]
    assert fleets and found == len(fleets)  # one hop per EC2 fleet's user data: the walk reads them all


def test_every_eks_serving_pod_hop_reads_its_key(eks_template):
    starts = template_starts(eks_template)
    deployments = [o for o in kube_objects(eks_template) if o.get("kind") == "Deployment"]
    serving = [o for o in deployments if o["metadata"]["labels"]["app.kubernetes.io/name"] == "gguf-serve"]
    assert starts and len(starts) == len(serving)  # one hop per profile's serving pod
    for argv in starts:
        assert not missing_key_source(argv), argv
        assert "--no-api-key" not in argv  # a pod has no gate in front of it but the key


def test_the_workstation_hops_have_their_key_source():
    assert not missing_key_source(native.hop_command(8080, 8081))
    starts = compose_starts(yaml.safe_load(COMPOSE.read_text()))
    assert len(starts) == 1 and not missing_key_source(starts[0])


def test_every_place_the_product_starts_a_hop_is_read_here():
    sources = [p for d in ("stacks", "userdata", "gguf_serve", "docker") for p in (ROOT / d).rglob("*") if p.is_file()]
    starting = set()
    for path in sources:
        if path.suffix in {".pyc"} or "__pycache__" in path.parts:
            continue
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith("gguf_serve/container/hop/"):
            continue  # the hop itself (its usage text)
        if _START.search(path.read_text(errors="replace")):
            starting.add(rel)
    assert starting == set(STARTS), f"hop starts not read by this test: {starting - set(STARTS)}"


def test_negative_control_a_user_data_hop_without_its_key_is_found(whole_apps):
    app = whole_apps["committed"]
    stack = next(s for s in app.stacks if "SageMaker" not in s)
    text = json.dumps(app.template(stack))
    assert "--api-key-env-file" in text
    stripped = json.loads(re.sub(r"--api-key-env-file [^ ]+ ", "", text))
    starts = template_starts(stripped)
    assert starts and all(missing_key_source(a) for a in starts)


def test_negative_control_an_eks_hop_without_its_key_is_found(eks_template):
    text = json.dumps(kube_objects(eks_template))
    assert '"--api-key-env-file", ' in text
    starts = manifest_starts(json.loads(re.sub(r', "--api-key-env-file", "[^"]+"', "", text)))
    assert starts and all(missing_key_source(a) for a in starts)


def test_negative_control_a_compose_hop_without_its_key_is_found():
    compose = yaml.safe_load(COMPOSE.read_text())
    compose["services"]["hop"]["command"] = ["--listen", "0.0.0.0:8080", "--upstream", "http://server:8080"]
    assert missing_key_source(compose_starts(compose)[0])


def test_a_gate_or_a_flag_with_its_value_counts_and_a_lookalike_does_not():
    assert not missing_key_source([MODULE, "--no-api-key", "IAM"])
    assert not missing_key_source([MODULE, "--api-key-env=LLAMA_API_KEY"])
    assert missing_key_source([MODULE, "--api-key-envelope", "x"])


def test_every_hop_behind_a_shared_endpoint_has_its_key_source(shared_templates):
    """The fleets behind one endpoint read the one shared key; a forward reaches the next fleet's hop, which checks
    the key again (tests/container/hop/test_models.py)."""
    starts = [argv for template in shared_templates.values() for argv in template_starts(template)]
    assert len(starts) == 3  # one per fleet behind it
    for argv in starts:
        assert not missing_key_source(argv), argv
        assert "--route" in argv  # each forwards the other fleets' models
