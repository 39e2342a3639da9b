"""In-region S3 copy of the GGUF files, so instances after the first read at S3 speed instead of ModelScope's."""

from __future__ import annotations

from aws_cdk import RemovalPolicy
from aws_cdk import aws_s3 as s3
from constructs import Construct

MODEL_PREFIX = "models/"


class ModelCache(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, access_logs: s3.IBucket) -> None:
        super().__init__(scope, construct_id)
        self.bucket = s3.Bucket(
            self,
            "Bucket",
            encryption=s3.BucketEncryption.S3_MANAGED,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            enforce_ssl=True,
            server_access_logs_bucket=access_logs,
            server_access_logs_prefix="model-cache/",
            removal_policy=RemovalPolicy.RETAIN,  # 20+ GB that took minutes to fetch; delete by hand
        )
        self.prefix = MODEL_PREFIX

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket.bucket_name}/{self.prefix}"
