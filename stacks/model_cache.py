"""In-region S3 copy of the GGUF files, so instances after the first read at S3 speed instead of ModelScope's."""

from __future__ import annotations

from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.private_bucket import private_bucket

MODEL_PREFIX = "models/"


class ModelCache(Construct):
    def __init__(self, scope: Construct, construct_id: str, *, access_logs: s3.IBucket) -> None:
        super().__init__(scope, construct_id)
        # Kept on stack deletion: 20+ GB that took minutes to fetch; delete by hand.
        self.bucket = private_bucket(
            self, "Bucket", server_access_logs_bucket=access_logs, server_access_logs_prefix="model-cache/"
        )
        self.prefix = MODEL_PREFIX

    @property
    def s3_url(self) -> str:
        return f"s3://{self.bucket.bucket_name}/{self.prefix}"
