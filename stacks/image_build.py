"""Build the llama.cpp serving image in region and push it to ECR, during `cdk deploy`.

CodeBuild runs on a native builder of the instance's architecture (arm64 for Graviton), so nobody compiles
llama.cpp under emulation on a laptop. The image tag is the hash of the build context: a change to docker/
or to the runtime packages gives a new tag, a new launch template and a rolling update.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from aws_cdk import CustomResource, Duration, IgnoreMode, RemovalPolicy, Stack
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from catalog.hardware import Architecture
from catalog.images import ImageTarget
from stacks.nag import acknowledge, arn_of

ROOT = Path(__file__).resolve().parent.parent
# The build context: Dockerfiles and the packages that run inside the container, nothing else.
BUILD_CONTEXT = ("docker", "catalog", "modelfetch", "launcher", "fleetmetrics")
HANDLERS = Path(__file__).resolve().parent / "handlers"

_BUILD_SPEC = {
    "version": "0.2",
    "phases": {
        "pre_build": {
            "commands": [
                'REGISTRY="${REPOSITORY_URI%%/*}"',
                'aws ecr get-login-password --region "$AWS_REGION" | docker login -u AWS --password-stdin "$REGISTRY"',
            ]
        },
        "build": {
            "commands": [
                'if aws ecr describe-images --repository-name "$REPOSITORY_NAME" --image-ids imageTag="$IMAGE_TAG" '
                '>/dev/null 2>&1; then echo "image $IMAGE_TAG already built"; exit 0; fi',
                'docker build -f "docker/$DOCKERFILE" $BUILD_ARGS -t "$REPOSITORY_URI:$IMAGE_TAG" .',
                'docker push "$REPOSITORY_URI:$IMAGE_TAG"',
            ]
        },
    },
}


class ImageBuild(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        target: ImageTarget,
        build_args: dict[str, str] | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        self.repository = ecr.Repository(
            self,
            "Repository",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,  # a tag is a content hash; never rewritten
            lifecycle_rules=[ecr.LifecycleRule(max_image_count=10, description="keep the last ten builds")],
            removal_policy=RemovalPolicy.RETAIN,
        )
        source = s3_assets.Asset(
            self,
            "Context",
            path=str(ROOT),
            ignore_mode=IgnoreMode.GIT,
            exclude=["*", *(f"!{d}/" for d in BUILD_CONTEXT), "__pycache__/", "*.pyc"],
        )
        args = " ".join(f"--build-arg {k}={v}" for k, v in sorted((build_args or {}).items()))
        # Same context and same build arguments give the same tag, and CodeBuild skips a tag that exists.
        self.image_tag = f"{target.name}-{hashlib.sha256((source.asset_hash + args).encode()).hexdigest()[:16]}"
        self.image_uri = self.repository.repository_uri_for_tag(self.image_tag)
        self.registry = _registry(self)

        key = kms.Key(self, "BuildKey", enable_key_rotation=True, description="CodeBuild artifacts and logs")
        arm = target.architecture == Architecture.ARM64
        project = codebuild.Project(
            self,
            "Project",
            description=f"llama.cpp image {target.name} from docker/{target.dockerfile}",
            source=codebuild.Source.s3(bucket=source.bucket, path=source.s3_object_key),
            build_spec=codebuild.BuildSpec.from_object(_BUILD_SPEC),
            environment=codebuild.BuildEnvironment(
                build_image=(
                    codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_3_0
                    if arm
                    else codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5
                ),
                compute_type=codebuild.ComputeType.LARGE,
                privileged=True,  # docker build
            ),
            environment_variables={
                "REPOSITORY_URI": codebuild.BuildEnvironmentVariable(value=self.repository.repository_uri),
                "REPOSITORY_NAME": codebuild.BuildEnvironmentVariable(value=self.repository.repository_name),
                "IMAGE_TAG": codebuild.BuildEnvironmentVariable(value=self.image_tag),
                "DOCKERFILE": codebuild.BuildEnvironmentVariable(value=target.dockerfile),
                "BUILD_ARGS": codebuild.BuildEnvironmentVariable(value=args),
                "DOCKER_BUILDKIT": codebuild.BuildEnvironmentVariable(value="1"),  # per-Dockerfile .dockerignore
            },
            encryption_key=key,
            timeout=Duration.hours(2),
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(
                    log_group=logs.LogGroup(
                        self, "BuildLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
                    )
                )
            ),
        )
        self.repository.grant_pull_push(project)
        acknowledge(
            project,
            "AwsSolutions-CB3",
            "docker build needs privileged mode; the project only builds this repo's image.",
        )
        project_id = Stack.of(self).get_logical_id(project.node.default_child)  # type: ignore[arg-type]
        region = Stack.of(self).region
        acknowledge(
            project,
            "AwsSolutions-IAM5",
            "CodeBuild's generated policy: read the source asset, its own report groups and log streams, use its "
            "KMS key, and ecr:GetAuthorizationToken (no resource-level permission).",
            findings=[
                "Action::s3:GetBucket*",
                "Action::s3:GetObject*",
                "Action::s3:List*",
                "Action::kms:GenerateDataKey*",
                "Action::kms:ReEncrypt*",
                "Resource::*",
                f"Resource::arn:{Stack.of(self).partition}:logs:{region}:<AWS::AccountId>:log-group:/aws/codebuild/"
                f"<{project_id}>:*",
                f"Resource::arn:{Stack.of(self).partition}:codebuild:{region}:<AWS::AccountId>:report-group/"
                f"<{project_id}>-*",
            ],
        )

        self.build = self._trigger(project)

    def _trigger(self, project: codebuild.Project) -> CustomResource:
        """A custom resource that starts the build and completes when it has pushed (or fails with its status)."""
        handlers = {}
        for name in ("start", "is_complete"):
            fn = lambda_.Function(
                self,
                f"{name.title().replace('_', '')}Handler",
                runtime=lambda_.Runtime.PYTHON_3_13,
                handler="index.handler",
                code=lambda_.Code.from_inline((HANDLERS / f"image_build_{name}.py").read_text()),
                timeout=Duration.seconds(30),
            )
            fn.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["codebuild:StartBuild", "codebuild:BatchGetBuilds"], resources=[project.project_arn]
                )
            )
            handlers[name] = fn
            acknowledge(
                fn,
                "AwsSolutions-L1",
                "Python 3.13 is supported in the China regions; 3.14 there is not verified by this project.",
            )
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=handlers["start"],
            is_complete_handler=handlers["is_complete"],
            query_interval=Duration.minutes(1),
            total_timeout=Duration.hours(2),
        )
        acknowledge(
            self,
            "AwsSolutions-IAM4",
            "Lambda basic execution role (CloudWatch Logs) for the build trigger.",
            findings=["Policy::arn:<AWS::Partition>:iam::aws:policy/service-role/AWSLambdaBasicExecutionRole"],
        )
        acknowledge(
            provider,
            "AwsSolutions-IAM5",
            "The provider framework invokes any version of its own handlers.",
            findings=[f"Resource::{arn_of(fn)}:*" for fn in (*handlers.values(), *_framework_functions(provider))],
        )
        acknowledge(provider, "AwsSolutions-L1", "The provider framework pins its own Node.js runtime.")
        acknowledge(
            provider, "AwsSolutions-SF1", "The provider's waiter only polls the build; CodeBuild logs the build."
        )
        acknowledge(
            provider, "AwsSolutions-SF2", "The provider's waiter only polls the build; no X-Ray traces to follow."
        )
        return CustomResource(
            self,
            "Build",
            service_token=provider.service_token,
            properties={"ProjectName": project.project_name, "ImageTag": self.image_tag},
        )


def _registry(scope: Construct) -> str:
    stack = Stack.of(scope)
    return f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}"


def _framework_functions(provider: cr.Provider) -> list[IConstruct]:
    return [c for c in provider.node.find_all() if isinstance(c, lambda_.Function) and "framework-" in c.node.id]
