"""The one way this app makes a bucket: private, TLS only, SSE-S3 (ELB log delivery cannot write with KMS), kept."""

from __future__ import annotations

from typing import Any

from aws_cdk import RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct


def private_bucket(scope: Construct, construct_id: str, **extra: Any) -> s3.Bucket:
    return s3.Bucket(
        scope,
        construct_id,
        encryption=s3.BucketEncryption.S3_MANAGED,
        block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
        enforce_ssl=True,
        removal_policy=RemovalPolicy.RETAIN,
        **extra,
    )
