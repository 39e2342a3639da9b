"""The locked GGUF, put in the stack's bucket by the project's own fetcher before the endpoint is created.

A CodeBuild project runs `python3 -m gguf_serve.container.launch fetch` from the image's own source asset (its
pure-Python wheels from the staged sources, checked against their SHA256SUMS): ranged download from ModelScope
(or the bucket, when a copy is there), sha256 checked while it streams, written back to S3 only once verified, with
the sha256 in the object's metadata. The prefix is the pin itself, `sagemaker/<sha256>/`, so it holds that one
object and nothing else writes there: the model's S3Prefix points at it, and SageMaker copies exactly that file.
A custom resource starts the build unless the object is already there (its size and metadata sha256 checked) and
completes when the build has; the model depends on it.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import CustomResource, Duration, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3 as s3
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.images import BUILD_POLL_INTERVAL_S, CUSTOM_RESOURCE_MAX_WAIT_S
from gguf_serve.container.spec import RuntimeSpec
from stacks.errors import PropsError
from stacks.nag import account_in_finding, acknowledge, arn_of

HANDLERS = Path(__file__).resolve().parent.parent / "handlers"
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
                'WORK="$(mktemp -d)" && mkdir "$WORK/site" && for w in "$CODEBUILD_SRC_DIR_sources"/wheels/*.whl; '
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
        handlers = {}
        for name in ("start", "is_complete"):
            fn = lambda_.Function(
                self,
                f"{name.title().replace('_', '')}Handler",
                runtime=lambda_.Runtime.PYTHON_3_13,
                handler="index.handler",
                code=lambda_.Code.from_inline((HANDLERS / f"model_staging_{name}.py").read_text()),
                timeout=Duration.seconds(30),
            )
            fn.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["codebuild:StartBuild", "codebuild:BatchGetBuilds"], resources=[project.project_arn]
                )
            )
            acknowledge(fn, "AwsSolutions-L1", "Python 3.13 is offered in the China regions; 3.14 is not verified.")
            handlers[name] = fn
        # HeadObject: is it staged already? (without ListBucket a missing object answers 403, not 404)
        handlers["start"].add_to_role_policy(
            iam.PolicyStatement(actions=["s3:GetObject"], resources=[bucket.arn_for_objects(self.key)])
        )
        handlers["start"].add_to_role_policy(
            iam.PolicyStatement(
                actions=["s3:ListBucket"], resources=[bucket.bucket_arn],
                conditions={"StringEquals": {"s3:prefix": [self.key]}},
            )
        )  # fmt: skip
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=handlers["start"],
            is_complete_handler=handlers["is_complete"],
            query_interval=Duration.seconds(BUILD_POLL_INTERVAL_S),
            total_timeout=Duration.seconds(CUSTOM_RESOURCE_MAX_WAIT_S - 5 * BUILD_POLL_INTERVAL_S),
        )
        _acknowledge_provider(self, provider, [*handlers.values()])
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


def _acknowledge_provider(scope: Construct, provider: cr.Provider, handlers: list[lambda_.Function]) -> None:
    framework = [c for c in provider.node.find_all() if isinstance(c, lambda_.Function) and "framework-" in c.node.id]
    acknowledge(
        scope,
        "AwsSolutions-IAM4",
        "Lambda basic execution role (CloudWatch Logs) for the staging trigger.",
        findings=["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
    )
    acknowledge(
        provider,
        "AwsSolutions-IAM5",
        "The provider framework invokes any version of its own handlers.",
        findings=[f"Resource::{arn_of(fn)}:*" for fn in (*handlers, *framework)],
    )
    acknowledge(provider, "AwsSolutions-L1", "The provider framework pins its own Node.js runtime.")
    acknowledge(provider, "AwsSolutions-SF1", "The provider's waiter only polls the build; CodeBuild logs it.")
    acknowledge(provider, "AwsSolutions-SF2", "The provider's waiter only polls the build; no X-Ray traces to follow.")
