"""The model cache, the API key and the access-log bucket, each alone."""

from __future__ import annotations

from aws_cdk import aws_iam as iam
from aws_cdk.assertions import Match, Template

from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.model_cache import ModelCache
from stacks.principals import ec2_principal


def test_model_cache_is_a_private_logged_bucket_kept_on_delete(stack):
    logs = AccessLogs(stack, "AccessLogs")
    cache = ModelCache(stack, "ModelCache", access_logs=logs.bucket)
    t = Template.from_stack(stack)
    t.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LoggingConfiguration": {"DestinationBucketName": Match.any_value(), "LogFilePrefix": "model-cache/"},
            "PublicAccessBlockConfiguration": Match.object_like({"BlockPublicAcls": True}),
        },
    )
    kept = [r for r in t.find_resources("AWS::S3::Bucket").values() if r.get("DeletionPolicy") == "Retain"]
    assert kept, "the model cache holds 20+ GB that took minutes to fetch: keep it on stack deletion"
    assert cache.prefix == "models/"


def test_api_key_is_a_generated_48_character_secret(stack):
    ApiKey(stack, "ApiKey")
    Template.from_stack(stack).has_resource_properties(
        "AWS::SecretsManager::Secret",
        {"GenerateSecretString": {"PasswordLength": 48, "ExcludePunctuation": True}},
    )


def test_access_logs_expire_after_90_days_and_accept_log_delivery(stack):
    AccessLogs(stack, "AccessLogs")
    Template.from_stack(stack).has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {"Rules": [Match.object_like({"ExpirationInDays": 90, "Status": "Enabled"})]},
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "ObjectWriter"}]},
        },
    )


def test_an_instance_role_in_china_trusts_both_names_of_ec2_and_elsewhere_the_one_cdk_renders(stack, regional_stack):
    for scope in (regional_stack, stack):  # cn-northwest-1; a stack without a region (the partition is unknown)
        iam.Role(scope, "InstanceRole", assumed_by=ec2_principal(scope))
    china = Template.from_stack(regional_stack).find_resources("AWS::IAM::Role")
    (role,) = china.values()
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": ["ec2.amazonaws.com", "ec2.amazonaws.com.cn"]}
    (role,) = Template.from_stack(stack).find_resources("AWS::IAM::Role").values()
    (statement,) = role["Properties"]["AssumeRolePolicyDocument"]["Statement"]
    assert statement["Principal"] == {"Service": "ec2.amazonaws.com"}
