"""The SageMaker stacks as the app builds them (the session's one whole-app synthesis, tests/stacks/conftest.py):
one per hosted profile, wired to the same image, the same lock and the fetcher's own S3 layout."""

from __future__ import annotations

import json

import pytest

from gguf_serve.catalog.hosting import sagemaker_profile, sagemaker_stack_name
from gguf_serve.container.fetch.s3cache import S3Cache
from gguf_serve.container.names import RUNTIME_SPEC_ENV
from stacks.app import MODEL_LOCK_CONTEXT, build_app, plan_app
from tests.committed import CATALOG, PROFILES
from tests.conftest import ROOT, cdk_context
from tests.stacks.conftest import STACK_NAMES

SAGEMAKER_STACKS = [sagemaker_stack_name(n) for n in STACK_NAMES]


def _template(assembly, name: str) -> dict:
    return assembly.get_stack_by_name(name).template


def _one(template: dict, kind: str) -> tuple[str, dict]:
    (found,) = [(k, v) for k, v in template["Resources"].items() if v["Type"] == kind]
    return found


def test_every_hosted_profile_has_its_sagemaker_stack_in_the_app(assembly):
    names = {s.stack_name for s in assembly.stacks}
    assert set(SAGEMAKER_STACKS) <= names and len(SAGEMAKER_STACKS) == len(STACK_NAMES)


@pytest.mark.parametrize("ec2_name", STACK_NAMES)
def test_the_model_is_the_profiles_runtime_on_the_staged_object(assembly, ec2_name):
    profile = next(p for p in PROFILES.values() if p.stack_name == ec2_name)
    template = _template(assembly, sagemaker_stack_name(ec2_name))
    model_id, model = _one(template, "AWS::SageMaker::Model")
    spec = json.loads(model["Properties"]["PrimaryContainer"]["Environment"][RUNTIME_SPEC_ENV])
    assert spec["model"]["file"] == profile.model.file and spec["server"]["parallel"] == profile.server.parallel
    sha = spec["model"]["sha256"]
    assert sha and len(sha) == 64  # the tests' lock pins every model (tests/catalog/stand_in.py)
    staged = next(
        v["Properties"] for v in template["Resources"].values()
        if v["Type"] == "AWS::CloudFormation::CustomResource" and "Sha256" in v["Properties"]
    )  # fmt: skip
    # The key staging checks is where the fetcher writes below the staged prefix: the same layout, one object
    cache = S3Cache(f"s3://bucket/sagemaker/{sha}/", client=object())
    assert staged["Key"] == cache.key(spec["model"]["repo"], spec["model"]["revision"], spec["model"]["file"])
    assert staged["Sha256"] == sha and int(staged["SizeBytes"]) == spec["model"]["size_bytes"]
    uri = model["Properties"]["PrimaryContainer"]["ModelDataSource"]["S3DataSource"]["S3Uri"]
    assert uri["Fn::Join"][1][-1] == f"/sagemaker/{sha}/"
    staging_id = next(
        k for k, v in template["Resources"].items()
        if v["Type"] == "AWS::CloudFormation::CustomResource" and "Sha256" in v["Properties"]
    )  # fmt: skip
    assert staging_id in model["DependsOn"] and any(d.startswith("ImageBuild") for d in model["DependsOn"])
    _, endpoint = _one(template, "AWS::SageMaker::Endpoint")
    hosting = CATALOG.hosting[profile.hardware.instance_type]
    assert endpoint["Properties"]["EndpointName"] == f"gguf-serve-{profile.name}"
    _, config = _one(template, "AWS::SageMaker::EndpointConfig")
    assert config["Properties"]["ProductionVariants"][0]["InstanceType"] == hosting.ml_type
    expected = json.loads(sagemaker_profile(profile, hosting).runtime().to_json())  # the flags, on the ml shape
    assert {k: v for k, v in spec.items() if k != "model"} == {k: v for k, v in expected.items() if k != "model"}


def test_the_image_is_the_ec2_stacks_image(assembly):
    for ec2_name in STACK_NAMES:
        tags = []
        for name in (ec2_name, sagemaker_stack_name(ec2_name)):
            build = next(
                v for k, v in _template(assembly, name)["Resources"].items()
                if k.startswith("ImageBuild") and v["Type"] == "AWS::CloudFormation::CustomResource"
            )  # fmt: skip
            tags.append(build["Properties"]["ImageTag"])
        assert tags[0] == tags[1], ec2_name  # one image for both targets


def test_a_stack_on_a_type_its_region_does_not_host_is_refused_naming_the_stacks_that_serve_its_model(tmp_path):
    ningxia = plan_app({**cdk_context()}, config_file=tmp_path / "absent.toml")
    beijing = plan_app({**cdk_context(), "region": "cn-north-1"}, config_file=tmp_path / "absent.toml")
    anyway = plan_app({**cdk_context(), "sagemakerUnlistedTypes": "true"}, config_file=tmp_path / "absent.toml")
    twins = [sagemaker_stack_name(n) for n in STACK_NAMES]
    endpoints = ["C5MoeSageMakerStack", "G4dnMoeSageMakerStack"]
    for plan in (ningxia, beijing, anyway):
        build_app(cdk_context(), plan=plan, annotate_refusals=False)  # the SageMaker refusals join the plan's
    assert sorted(ningxia.refusals) == sorted(twins)
    assert sorted(beijing.refusals) == sorted(t for t in twins if t != "GpuMtpSageMakerStack")  # ml.g5 in Beijing
    assert anyway.refusals == {}
    why = ningxia.refusals["GravitonMoeSageMakerStack"]
    assert "ml.c8g.4xlarge is not hosted in cn-northwest-1" in why and "sagemakerUnlistedTypes=true" in why
    assert all(f"{e} (ml." in why for e in endpoints)  # the stacks that serve the 35B-A3B there
    assert "no SageMaker stack of this app serves Qwen3.6-27B" in ningxia.refusals["GpuMtpSageMakerStack"]


def test_the_cli_refuses_the_unhosted_stack_and_synthesizes_the_hosted_one(tmp_path):
    app = build_app(cdk_context(), config_file=tmp_path / "absent.toml",
                    stack_names=["GravitonMoeSageMakerStack", "C5MoeSageMakerStack"])  # fmt: skip

    def errors(name: str) -> list[str]:  # read before synth: in-process synth fails on the first one
        return [str(m.data) for m in app.node.find_child(name).node.metadata if m.type == "aws:cdk:error"]

    assert any("ml.c8g.4xlarge is not hosted in cn-northwest-1" in e for e in errors("GravitonMoeSageMakerStack"))
    assert errors("C5MoeSageMakerStack") == []


def test_a_model_without_a_pinned_sha256_refuses_only_its_sagemaker_stack(tmp_path):
    committed = ROOT / "profiles" / "models.lock.toml"  # the 27B is typed there, without a sha256
    ctx = {**cdk_context(), MODEL_LOCK_CONTEXT: str(committed.relative_to(ROOT)), "sagemakerUnlistedTypes": "true"}
    names = ["GpuMtpSageMakerStack", "GravitonMoeSageMakerStack"]
    plan = plan_app(ctx, config_file=tmp_path / "absent.toml", stack_names=names)
    build_app(ctx, plan=plan, annotate_refusals=False)  # the SageMaker stacks' refusals go to the plan's
    refusals = plan.refusals
    assert list(refusals) == ["GpuMtpSageMakerStack"]
    assert refusals["GpuMtpSageMakerStack"].startswith("GpuMtpSageMakerStack: model Qwen3.6-27B")


def test_the_late_refusal_fallbacks_scale_on_busy_slots_and_name_no_ami_version(whole_apps, committed):
    """Beijing's set: sagemakerScalingMetric=slots, sagemakerInferenceAmi=false (docs/first-deploy.md)."""
    beijing = whole_apps["beijing-cost-saver"].template("GpuMtpSageMakerStack")
    default = committed.template("GpuMtpSageMakerStack")
    for template, ami, metric in ((default, True, "predefined"), (beijing, False, "custom")):
        [config] = [r["Properties"] for r in template["Resources"].values()
                    if r["Type"] == "AWS::SageMaker::EndpointConfig"]  # fmt: skip
        assert ("InferenceAmiVersion" in config["ProductionVariants"][0]) is ami
        [policy] = [r["Properties"] for r in template["Resources"].values()
                    if r["Type"] == "AWS::ApplicationAutoScaling::ScalingPolicy"]  # fmt: skip
        tracking = policy["TargetTrackingScalingPolicyConfiguration"]
        if metric == "predefined":
            kind = tracking["PredefinedMetricSpecification"]["PredefinedMetricType"]
            assert kind == "SageMakerVariantConcurrentRequestsPerModelHighResolution"
        else:
            custom = tracking["CustomizedMetricSpecification"]
            assert custom["MetricName"] == "SlotsBusyRatio" and custom["Namespace"] == "GgufServe/LlamaServer"
            assert {d["Name"] for d in custom["Dimensions"]} == {"EndpointName", "VariantName"}
            assert tracking["TargetValue"] == 70.0  # the profile's target_busy_slot_ratio, as a percentage
