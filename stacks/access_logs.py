"""Bucket for ALB and S3 access logs (SSE-S3: ELB log delivery cannot write with KMS)."""

from __future__ import annotations

from aws_cdk import Duration
from aws_cdk import aws_s3 as s3
from constructs import Construct

from stacks.nag import acknowledge
from stacks.private_bucket import private_bucket


class AccessLogs(Construct):
    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        self.bucket = private_bucket(
            self,
            "Bucket",
            object_ownership=s3.ObjectOwnership.OBJECT_WRITER,
            lifecycle_rules=[s3.LifecycleRule(expiration=Duration.days(90))],
        )
        acknowledge(self.bucket, "AwsSolutions-S1", "This is the access-log bucket; logging it to itself would loop.")
