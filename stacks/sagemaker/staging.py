"""The locked GGUF, put in the stack's bucket by the project's own fetcher before the endpoint is created.

A CodeBuild project runs `python3 -m gguf_serve.container.launch fetch` from the image's own source asset (its
pure-Python wheels, `*-none-any`, from the staged sources, checked against their SHA256SUMS): ranged download from
ModelScope (or the bucket, when a copy is there), sha256 checked while it streams, written back to S3 only once
verified, with the sha256 in the object's metadata. The prefix is the pin itself, `sagemaker/<sha256>/`, so it holds
that one object and nothing else writes there: the model's S3Prefix points at it, and SageMaker copies exactly that
file. A custom resource starts the build unless the object is already there (its size and metadata sha256 checked)
and completes when the build has; the model depends on it.
"""

from __future__ import annotations

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.images import CUSTOM_RESOURCE_MAX_WAIT_S
from gguf_serve.container.spec import RuntimeSpec
from stacks.build_step import build_step_provider
from stacks.errors import PropsError
from stacks.nag import account_in_finding, acknowledge

STAGING_PREFIX = "sagemaker"
# The fetcher needs Python 3.11+ (hashlib.file_digest); CodeBuild's Amazon Linux 2023 standard image 5.0 offers
# 3.11-3.13 ("Available runtimes", CodeBuild User Guide, https://docs.amazonaws.cn/en_us/codebuild/latest/userguide/
# available-runtimes.html). MEDIUM: 4 vCPU, 7 GB memory, 128 GB disk for the 23 GB download ("Build environment
# compute types", https://docs.amazonaws.cn/en_us/codebuild/latest/userguide/build-env-ref-compute-types.html).
_BUILD_SPEC = {
    "version": "0.2",
    "phases": {
        "install": {"runtime-versions": {"python": "3.12"}},
        "build": {
            # buildspec 0.2 runs every command in one shell: WORK carries over
            "commands": [
                '(cd "$CODEBUILD_SRC_DIR_sources/wheels" && sha256sum -c --quiet SHA256SUMS)',
                'WORK="$(mktemp -d)" && mkdir "$WORK/site" && '
                'for w in "$CODEBUILD_SRC_DIR_sources"/wheels/*-none-any.whl; '
                'do python3 -m zipfile -e "$w" "$WORK/site"; done',
                'printf %s "$RUNTIME_SPEC" > "$WORK/runtime.json"',
                'PYTHONPATH="$CODEBUILD_SRC_DIR:$WORK/site" python3 -m gguf_serve.container.launch fetch '
                '--spec "$WORK/runtime.json" --model-dir "$WORK/model" --s3-cache "$STAGING_URI" --connections 8',
            ]
        },
    },
}


class ModelStaging(Construct):
    """Exposes `prefix_uri` (the model's S3Prefix), `key` (the one object) and `resource` (what the model waits for)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        runtime: RuntimeSpec,
        bucket: s3.IBucket,
        context: s3_assets.Asset,
        sources: s3_assets.Asset,
        timeout_s: int,
    ) -> None:
        """
        runtime: the profile's runtime spec: which file, its size and the sha256 it is pinned at (required).
        bucket: the stack's model bucket; the object lands under sagemaker/<sha256>/.
        context, sources: the image build's source and staged-sources assets (the fetcher and its wheels).
        timeout_s: the staging's worst case (gguf_serve.catalog.hosting plan_sagemaker), under CloudFormation's wait.
        """
        model = runtime.model
        if not model.sha256:
            raise ProfileError(f"model staging: {model.name} has no pinned sha256; lock it before a SageMaker deploy")
        if not 0 < timeout_s < CUSTOM_RESOURCE_MAX_WAIT_S:
            raise PropsError(f"model staging: timeout_s {timeout_s} must be 1 to {CUSTOM_RESOURCE_MAX_WAIT_S - 1}")
        super().__init__(scope, construct_id)
        prefix = f"{STAGING_PREFIX}/{model.sha256}"
        self.prefix_uri = f"s3://{bucket.bucket_name}/{prefix}/"
        self.key = f"{prefix}/{model.repo}/{model.revision}/{model.file}"  # the model cache's layout below it
        self.key_prefix = prefix
        project = self._project(runtime, bucket, context, sources, timeout_s)
        self.resource = self._resource(project, bucket, model.size_bytes, model.sha256, timeout_s)

    def _project(
        self, runtime: RuntimeSpec, bucket: s3.IBucket, context: s3_assets.Asset, sources: s3_assets.Asset,
        timeout_s: int,
    ) -> codebuild.Project:  # fmt: skip
        project = codebuild.Project(
            self,
            "Project",
            description=f"Stage {runtime.model.file} (sha256 {runtime.model.sha256[:12]}...) for SageMaker",
            source=codebuild.Source.s3(bucket=context.bucket, path=context.s3_object_key),
            secondary_sources=[
                codebuild.Source.s3(bucket=sources.bucket, path=sources.s3_object_key, identifier="sources")
            ],
            build_spec=codebuild.BuildSpec.from_object(_BUILD_SPEC),
            environment=codebuild.BuildEnvironment(
                build_image=codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5, compute_type=codebuild.ComputeType.MEDIUM
            ),
            environment_variables={
                "RUNTIME_SPEC": codebuild.BuildEnvironmentVariable(value=runtime.to_json()),
                "STAGING_URI": codebuild.BuildEnvironmentVariable(value=self.prefix_uri),
            },
            encryption_key=kms.Key(self, "Key", enable_key_rotation=True, description="Model staging artifacts"),
            timeout=Duration.minutes(-(-timeout_s // 60) + 5),
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(
                    log_group=logs.LogGroup(
                        self, "Logs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
                    )
                )
            ),
        )
        bucket.grant_read_write(project, f"{self.key_prefix}/*")
        stack = Stack.of(self)
        project_id = stack.get_logical_id(project.node.default_child)  # type: ignore[arg-type]
        acknowledge(
            project,
            "AwsSolutions-IAM5",
            "CodeBuild's generated policy (source assets, its report groups and log streams, its KMS key) and the "
            "staging prefix sagemaker/<sha256>/*, the only place it writes.",
            findings=[
                "Action::s3:GetBucket*", "Action::s3:GetObject*", "Action::s3:List*", "Action::s3:DeleteObject*",
                "Action::s3:Abort*", "Action::kms:GenerateDataKey*", "Action::kms:ReEncrypt*",
                f"Resource::<{stack.get_logical_id(bucket.node.default_child)}.Arn>/{self.key_prefix}/*",  # type: ignore[arg-type]
                f"Resource::arn:{stack.partition}:logs:{stack.region}:{account_in_finding(stack)}:log-group:"
                f"/aws/codebuild/<{project_id}>:*",
                f"Resource::arn:{stack.partition}:codebuild:{stack.region}:{account_in_finding(stack)}:report-group/"
                f"<{project_id}>-*",
            ],
        )  # fmt: skip
        return project

    def _resource(
        self, project: codebuild.Project, bucket: s3.IBucket, size: int, sha256: str, timeout_s: int
    ) -> CustomResource:
        start, provider = build_step_provider(
            self, project=project, start="model_staging_start.py", what="model staging",
            look="its CodeBuild log says why (the fetcher's last line)",
        )  # fmt: skip
        # HeadObject: is it staged already? (without ListBucket a missing object answers 403, not 404)
        start.add_to_role_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(self.key)])
        )
        start.add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
                conditions={"StringEquals": {"s3:prefix": [self.key]}},
            )
        )  # fmt: skip
        resource = CustomResource(
            self,
            "Staged",
            service_token=provider.service_token,
            properties={
                "ProjectName": project.project_name,
                "Bucket": bucket.bucket_name,
                "Key": self.key,
                "SizeBytes": str(size),
                "Sha256": sha256,
            },
        )
        resource.node.default_child.add_property_override("ServiceTimeout", CUSTOM_RESOURCE_MAX_WAIT_S)  # type: ignore[union-attr]
        return resource
