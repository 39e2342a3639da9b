"""The model cache, the API key and the access-log bucket, each alone."""

from __future__ import annotations

from aws_cdk.assertions import Match, Template

from stacks.access_logs import AccessLogs
from stacks.api_key import ApiKey
from stacks.model_cache import ModelCache


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
