"""SageMaker hosting as data (profiles/sagemaker.toml) and the endpoint's numbers derived from a profile."""

from __future__ import annotations

import math
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from gguf_serve.catalog import ProfileError
from gguf_serve.catalog.hosting import (
    MIB,
    VERIFY_MIB_S,
    endpoint_name,
    plan_sagemaker,
    sagemaker_profile,
    sagemaker_stack_name,
)
from gguf_serve.catalog.loader import load_catalog
from gguf_serve.container.flags import llama_server_args
from tests.catalog.stand_in import ROOT
from tests.committed import CATALOG, PROFILES


def test_every_stack_profile_but_none_on_c8i_has_its_own_ml_type():
    hosted = {p.stack_name: CATALOG.hosting[p.hardware.instance_type].ml_type for p in PROFILES.values()}
    assert hosted == {
        "GravitonMoeStack": "ml.c8g.4xlarge",
        "GravitonMoeHeadroomStack": "ml.c8g.8xlarge",
        "IntelMoeStack": "ml.c7i.4xlarge",  # SageMaker has no ml.c8i
        "GpuMtpStack": "ml.g5.xlarge",
    }
    assert all(h.price_is_estimate for h in CATALOG.hosting.values())  # no China SageMaker price was reachable


def test_each_ml_type_is_one_the_pinned_sdk_knows_for_hosting():
    import botocore.session

    model = botocore.session.get_session().get_service_model("sagemaker")
    known = set(model.shape_for("ProductionVariantInstanceType").enum)
    assert {h.ml_type for h in CATALOG.hosting.values()} <= known
    assert not [t for t in known if t.startswith("ml.c8i.")]  # hence ml.c7i for the Intel profile
    amis = set(model.shape_for("ProductionVariantInferenceAmiVersion").enum)
    assert {h.inference_ami for h in CATALOG.hosting.values() if h.inference_ami} <= amis


def test_a_profile_on_its_ml_type_keeps_model_and_flags_and_is_checked_on_that_shape():
    intel = PROFILES["intel-moe"]
    on = sagemaker_profile(intel, CATALOG.hosting["c8i.4xlarge"])
    assert on.stack_name == "IntelMoeSageMakerStack" and on.hardware.instance_type == "ml.c7i.4xlarge"
    assert on.runtime().model == intel.runtime().model and on.server == intel.server
    assert on.threads == 8 and on.hardware.ri_1yr_all_upfront_cny is None
    small = replace(CATALOG.hosting["c8i.4xlarge"], memory_gib=16)  # a shape the 35B model does not fit
    with pytest.raises(ProfileError, match=r"on SageMaker \(ml.c7i.4xlarge\): profile 'intel-moe': .* needs"):
        sagemaker_profile(intel, small)


def test_the_plan_comes_from_the_profiles_load_budget():
    p = PROFILES["graviton-moe"]
    plan = plan_sagemaker(sagemaker_profile(p, CATALOG.hosting["c8g.4xlarge"]), CATALOG.hosting["c8g.4xlarge"])
    size = p.model.size_bytes
    assert plan.startup_timeout_s == math.ceil((size / (VERIFY_MIB_S * MIB) + p.fleet.boot.model_load_s) / 60) * 60
    assert plan.download_timeout_s == math.ceil(size / (p.fleet.boot.cache_read_mib_s * MIB) / 60) * 60
    assert plan.volume_gb == math.ceil(size / 1024**3) + p.fleet.volume.image_headroom_gib
    assert (plan.min_instances, plan.max_instances) == (p.fleet.capacity.min_capacity, p.fleet.capacity.max_capacity)
    assert 60 <= plan.startup_timeout_s <= 3600 and plan.staging_s < 3300
    gpu = PROFILES["gpu-mtp"]
    gpu_plan = plan_sagemaker(sagemaker_profile(gpu, CATALOG.hosting["g5.xlarge"]), CATALOG.hosting["g5.xlarge"])
    assert gpu_plan.volume_gb is None and gpu_plan.target_concurrency == 0.7  # one MTP slot


def test_a_model_past_sagemakers_limits_is_refused_with_the_numbers():
    p = PROFILES["graviton-moe"]
    hosting = CATALOG.hosting["c8g.4xlarge"]
    slow = replace(p, fleet=p.fleet.changed(model_load_s=3580))  # + 54 s to hash 22.7 GB at the planning rate
    with pytest.raises(ProfileError, match=r"the startup health check needs 3\d{3} s .* more than SageMaker's 3600 s"):
        plan_sagemaker(slow, hosting)
    crawl = replace(p, fleet=p.fleet.changed(planning_download_mib_s=5.0))
    with pytest.raises(ProfileError, match="staging Qwen3.6-35B-A3B may take .* more than a custom resource can wait"):
        plan_sagemaker(crawl, hosting)


def test_names():
    assert sagemaker_stack_name("GravitonMoeStack") == "GravitonMoeSageMakerStack"
    assert endpoint_name(PROFILES["graviton-moe-headroom"]) == "gguf-serve-graviton-moe-headroom"


@pytest.fixture()
def profiles(tmp_path: Path) -> Path:
    return Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))


@pytest.mark.parametrize(
    ("old", "new", "match"),
    [
        ('[hosting."c8g.4xlarge"]', '[hosting."c9g.4xlarge"]', r'hosting."c9g.4xlarge": unknown instance type'),
        ('ml_type = "ml.c8g.4xlarge"', 'ml_type = "c8g.4xlarge"', "ml_type must be an ml.\\* type"),
        ("physical_cores = 16  # Graviton4", 'physical_cores = "16"  #', "physical_cores must be an integer"),
        ('cpu = "AWS Graviton4 (Neoverse V2)"\non_demand', 'cpu = "x"\nspot = true\non_demand', "unknown key 'spot'"),
    ],
)
def test_a_bad_hosting_table_names_file_key_and_fix(profiles, old, new, match):
    path = profiles / "sagemaker.toml"
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(ProfileError, match=match):
        load_catalog(profiles, skip_unlocked=True)


def test_without_the_file_there_is_no_sagemaker_family(profiles):
    (profiles / "sagemaker.toml").unlink()
    catalog = load_catalog(profiles, skip_unlocked=True)
    assert catalog.hosting == {} and catalog.endpoint_profiles == {}


# --- which region hosts which type, and the endpoint profiles Ningxia gets ------------------------------------------

CHINA = ("cn-northwest-1", "cn-north-1")


def test_the_pinned_hosting_lists_are_the_installed_cfn_lints():
    """profiles/sagemaker-hosted.toml is a copy: held to the file of the cfn-lint the scan tier runs."""
    import importlib.metadata
    import json

    import cfnlint

    data = Path(cfnlint.__file__).parent / "data/schemas/extensions/aws_sagemaker_hosting/instancetype_enum.json"
    upstream = json.loads(data.read_text())
    assert CATALOG.hosted.regions == {r: frozenset(upstream[r]["enum"]) for r in CHINA}
    assert importlib.metadata.version("cfn-lint") in CATALOG.hosted.source


def test_no_twin_type_is_hosted_in_ningxia_and_only_the_mtp_one_in_beijing():
    twins = {h.ml_type for h in CATALOG.hosting.values()}
    assert not [t for t in twins if CATALOG.hosted.hosts("cn-northwest-1", t)]
    assert [t for t in twins if CATALOG.hosted.hosts("cn-north-1", t)] == ["ml.g5.xlarge"]
    assert CATALOG.hosted.hosts("eu-west-1", "ml.g5.xlarge") is None  # not pinned: unknown, never "no"


def test_each_endpoint_type_is_hosted_in_both_china_regions_known_to_the_sdk_and_estimated():
    import botocore.session

    known = set(botocore.session.get_session().get_service_model("sagemaker").shape_for(
        "ProductionVariantInstanceType").enum)  # fmt: skip
    assert set(CATALOG.endpoint_types) == {"ml.c5.9xlarge", "ml.g4dn.2xlarge"}
    for ml_type, t in CATALOG.endpoint_types.items():
        assert all(CATALOG.hosted.hosts(r, ml_type) for r in CHINA) and ml_type in known
        assert t.price_is_estimate and t.estimated_tok_s and t.estimate_basis


def test_the_endpoint_profiles_serve_the_moe_on_cpu_and_on_a_t4_with_experts_in_host_ram():
    cpu, gpu = CATALOG.endpoint_profiles["c5-moe"], CATALOG.endpoint_profiles["g4dn-moe"]
    assert (cpu.stack_name, cpu.hardware.instance_type, cpu.threads) == ("C5MoeSageMakerStack", "ml.c5.9xlarge", 18)
    assert cpu.model.name == gpu.model.name == "Qwen3.6-35B-A3B" and not cpu.mtp and not gpu.mtp
    assert gpu.image.name == "cuda-t4" and gpu.on_gpu
    plan = gpu.memory_plan()
    assert 0 < gpu.server.n_cpu_moe < 40 and plan["cpu_experts"] > 0  # "auto": some blocks' experts stay on the host
    fewer = gpu.with_server  # one block fewer on the host no longer fits the T4
    with pytest.raises(ProfileError, match="of NVIDIA T4 memory"):
        fewer(n_cpu_moe=gpu.server.n_cpu_moe - 1)
    args = llama_server_args(gpu.runtime(), "/opt/ml/model/m.gguf")
    assert args[args.index("--n-cpu-moe") + 1] == str(gpu.server.n_cpu_moe)


def test_an_image_for_a_newer_gpu_is_refused_on_the_t4_with_the_one_that_runs():
    gpu = CATALOG.endpoint_profiles["g4dn-moe"]
    from gguf_serve.catalog.images import IMAGE_TARGETS

    with pytest.raises(ProfileError, match=r"compiled for CUDA compute capability 86.*is 7.5.*use image cuda-t4"):
        replace(gpu, image=IMAGE_TARGETS["cuda"])
