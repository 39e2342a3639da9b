"""Build the serving image in region and push it to ECR, during `cdk deploy`, from nothing outside the region.

Three stages, each its own CodeBuild run under its own custom resource (so each has CloudFormation's whole hour),
each keeping what it made in ECR under the key of its inputs, so a retry or a later stack starts from it:
- the Debian roots, bootstrapped from the first of the debianMirrors that answers with the signed release
  (docker/pick-mirror.sh; signatures checked against a pinned keyring), tagged `root-<role>-<arch>-...-<key>`;
- the llama.cpp base (docker/<target>.Dockerfile on those roots), tagged `base-<target>-<hash>`: only a llama.cpp,
  flags or root change rebuilds it;
- the application image (docker/app.Dockerfile: the runtime packages on that base), tagged `<target>-<hash>`.
What the builder would otherwise download is staged before deploy (stacks.staged_sources), in a second S3 asset.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import (
    Annotations,
    AssetHashType,
    CustomResource,
    Duration,
    IgnoreMode,
    RemovalPolicy,
    Stack,
)
from aws_cdk import aws_codebuild as codebuild
from aws_cdk import aws_ecr as ecr
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct

from gguf_serve.catalog.hardware import Architecture
from gguf_serve.catalog.images import (
    APP_DOCKERFILE,
    ARM64_BUILDERS,
    BUILD_STAGES,
    CUSTOM_RESOURCE_MAX_WAIT_S,
    DEFAULT_ARM64_BUILDER,
    DEFAULT_COMPUTE,
    DEFAULT_DEBIAN_MIRRORS,
    LAYER_BUILD_TIMEOUT_MIN,
    ImageTarget,
    stage_compute,
)
from stacks.build_step import build_step_provider
from stacks.errors import PropsError
from stacks.image_checks import check_build_args, check_debian_mirrors, foreign_ecr_repositories
from stacks.image_inputs import CONTEXT_EXCLUDE, IMAGE_CODE, ROOT, app_files, app_key, base_key
from stacks.nag import account_in_finding, acknowledge
from stacks.staged_sources import check_staged_sources, default_sources_dir, pinned_sources

# The image's inputs, for the scripts and image tests that read them from here (scripts/gpu-check.sh, tests/images).
__all__ = ["IMAGE_CODE", "ROOT", "ImageBuild", "app_files", "app_key", "base_key", "default_sources_dir"]
__all__ += ["pinned_sources"]


_BUILD_SPEC = {
    "version": "0.2",
    "phases": {
        "pre_build": {
            "commands": [
                'REGISTRY="${REPOSITORY_URI%%/*}"',
                'aws ecr get-login-password --region "$AWS_REGION" | docker login -u AWS --password-stdin "$REGISTRY"',
            ]
        },
        # STAGE (base or app) comes from the custom resource that started the build.
        "build": {"commands": ['SOURCES_DIR="$CODEBUILD_SRC_DIR_sources" bash docker/build-image.sh']},
    },
}


class ImageBuild(Construct):
    """An ECR repository, a CodeBuild project and three custom resources that build the image during deploy.

    Exposes `target`, `repository`, `image_tag`, `base_tag`, `image_uri`, `registry` and `build` (the app layer's
    custom resource: what the fleet waits for), and its S3 assets `context_asset` and `sources_asset`.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        target: ImageTarget,
        build_args: dict[str, str] | None = None,
        sources_dir: Path | None = None,
        arm64_builder: str = DEFAULT_ARM64_BUILDER,
        debian_mirrors: tuple[str, ...] = DEFAULT_DEBIAN_MIRRORS,
    ) -> None:
        """
        target: the image target (gguf_serve.catalog.images.IMAGE_TARGETS).
        build_args: NAME=value Docker build arguments (-c imageBuildArgs), checked here; default none.
        sources_dir: the staged llama.cpp sdist, wheels and debootstrap; default default_sources_dir().
        arm64_builder: "cross" (x86 CodeBuild with a cross compiler, offered wherever CodeBuild is) or "native"
            (CodeBuild ARM_CONTAINER, where the region offers it); default "cross". Ignored for x86 targets.
        debian_mirrors: the Debian mirrors the roots may come from, probed in order (http or https); default
            gguf_serve.catalog.images.DEFAULT_DEBIAN_MIRRORS.
        """
        if arm64_builder not in ARM64_BUILDERS:
            raise PropsError(f"arm64 builder {arm64_builder!r}: use one of {', '.join(ARM64_BUILDERS)}")
        mirrors = check_debian_mirrors(debian_mirrors)
        args = check_build_args(target, {**dict(target.build_args), **(build_args or {})})
        super().__init__(scope, construct_id)
        self.target = target
        self.repository = ecr.Repository(
            self,
            "Repository",
            image_scan_on_push=True,
            image_tag_mutability=ecr.TagMutability.IMMUTABLE,  # a tag is a key of its inputs; never rewritten
            lifecycle_rules=[
                ecr.LifecycleRule(
                    rule_priority=1,
                    tag_prefix_list=["base-"],
                    max_image_count=3,
                    description="keep the last three llama.cpp bases",
                ),
                ecr.LifecycleRule(
                    rule_priority=2,
                    tag_prefix_list=["root-"],
                    max_image_count=8,
                    description="keep the last eight bootstrapped roots (two per base, three bases, and a check root)",
                ),
                ecr.LifecycleRule(rule_priority=3, max_image_count=10, description="keep the last ten images"),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        context, sources = self._assets(sources_dir or default_sources_dir())
        self.context_asset, self.sources_asset = context, sources  # the model staging reads them too
        self.base_tag = f"base-{target.name}-{base_key(target, args)}"
        self.image_tag = f"{target.name}-{app_key(self.base_tag, args)}"
        self.image_uri = self.repository.repository_uri_for_tag(self.image_tag)
        self.registry = _registry(self)
        native_arm = target.architecture == Architecture.ARM64 and arm64_builder == "native"
        project = self._project(target, args, context, sources, native_arm=native_arm, debian_mirrors=mirrors)
        provider = self._provider(project)
        # Each stage skips itself when its tag exists; the roots are needed only while the base does not.
        tags = {"roots": self.base_tag, "base": self.base_tag, "app": self.image_tag}
        ids = {"roots": "RootsBuild", "base": "BaseBuild", "app": "Build"}
        stages = [
            self._layer(ids[stage], provider, project, tags[stage], stage, stage_compute(target, stage))
            for stage in BUILD_STAGES
        ]
        for before, after in zip(stages, stages[1:], strict=False):
            after.node.add_dependency(before)
        self.build = stages[-1]

    def _assets(self, sources_dir: Path) -> tuple[s3_assets.Asset, s3_assets.Asset]:
        """The build context (docker/ and the runtime packages) and the staged sources, as S3 assets."""
        context = s3_assets.Asset(
            self, "Context", path=str(ROOT), ignore_mode=IgnoreMode.GIT, exclude=list(CONTEXT_EXCLUDE)
        )
        staged = check_staged_sources(sources_dir)
        if staged.problems:
            Annotations.of(self).add_error(
                "the image build's sources are not staged: "
                + "; ".join(staged.problems)
                + ". Run `make image-sources` (scripts/stage-image-sources.sh) before `cdk deploy`"
            )
        sources = s3_assets.Asset(
            self,
            "Sources",
            path=str(staged.path),
            asset_hash_type=AssetHashType.CUSTOM,
            asset_hash=staged.digest,
        )
        return context, sources

    def _project(
        self,
        target: ImageTarget,
        args: dict[str, str],
        context: s3_assets.Asset,
        sources: s3_assets.Asset,
        *,
        native_arm: bool,
        debian_mirrors: tuple[str, ...],
    ) -> codebuild.Project:
        key = kms.Key(self, "BuildKey", enable_key_rotation=True, description="CodeBuild artifacts and logs")
        project = codebuild.Project(
            self,
            "Project",
            description=f"llama.cpp image {target.name}: roots, docker/{target.dockerfile}, docker/{APP_DOCKERFILE}",
            source=codebuild.Source.s3(bucket=context.bucket, path=context.s3_object_key),
            secondary_sources=[
                codebuild.Source.s3(bucket=sources.bucket, path=sources.s3_object_key, identifier="sources")
            ],
            build_spec=codebuild.BuildSpec.from_object(_BUILD_SPEC),
            environment=codebuild.BuildEnvironment(
                build_image=(
                    codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_3_0
                    if native_arm
                    else codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5
                ),
                # A stage may override it (stage_compute, the start handler's computeTypeOverride).
                compute_type=getattr(codebuild.ComputeType, DEFAULT_COMPUTE.removeprefix("BUILD_GENERAL1_")),
                privileged=True,  # docker build
            ),
            environment_variables={
                name: codebuild.BuildEnvironmentVariable(value=value)
                for name, value in {
                    "REPOSITORY_URI": self.repository.repository_uri,
                    "REPOSITORY_NAME": self.repository.repository_name,
                    "TARGET": target.dockerfile.removesuffix(".Dockerfile"),
                    "PLATFORM": target.platform,
                    "BASE_TAG": self.base_tag,
                    "IMAGE_TAG": self.image_tag,
                    "BUILD_ARGS": " ".join(f"{k}={v}" for k, v in sorted(args.items())),
                    "DEBIAN_MIRRORS": " ".join(debian_mirrors),
                    "STAGE": "all",
                    "DOCKER_BUILDKIT": "1",  # per-Dockerfile .dockerignore
                }.items()
            },
            encryption_key=key,
            timeout=Duration.minutes(LAYER_BUILD_TIMEOUT_MIN),
            logging=codebuild.LoggingOptions(
                cloud_watch=codebuild.CloudWatchLoggingOptions(
                    log_group=logs.LogGroup(
                        self, "BuildLogs", retention=logs.RetentionDays.ONE_MONTH, removal_policy=RemovalPolicy.DESTROY
                    )
                )
            ),
        )
        self._grant(project, args)
        return project

    def _grant(self, project: codebuild.Project, args: dict[str, str]) -> None:
        self.repository.grant_pull_push(project)
        # The build's "tag exists, skip" check: without it every rebuild of an existing tag fails to push.
        self.repository.grant(project, "ecr:DescribeImages")
        for repository_arn in foreign_ecr_repositories(self, args):
            project.add_to_role_policy(
                iam.PolicyStatement(
                    actions=["ecr:BatchGetImage", "ecr:GetDownloadUrlForLayer", "ecr:BatchCheckLayerAvailability"],
                    resources=[repository_arn],
                )
            )
        acknowledge(
            project,
            "AwsSolutions-CB3",
            "docker build needs privileged mode; the project only builds this repo's image.",
        )
        stack = Stack.of(self)
        project_id = stack.get_logical_id(project.node.default_child)  # type: ignore[arg-type]
        region, account = stack.region, account_in_finding(stack)
        acknowledge(
            project,
            "AwsSolutions-IAM5",
            "CodeBuild's generated policy: read the source assets, its own report groups and log streams, use its "
            "KMS key, and ecr:GetAuthorizationToken (no resource-level permission).",
            findings=[
                "Action::s3:GetBucket*",
                "Action::s3:GetObject*",
                "Action::s3:List*",
                "Action::kms:GenerateDataKey*",
                "Action::kms:ReEncrypt*",
                "Resource::*",
                f"Resource::arn:{stack.partition}:logs:{region}:{account}:log-group:/aws/codebuild/<{project_id}>:*",
                f"Resource::arn:{stack.partition}:codebuild:{region}:{account}:report-group/<{project_id}>-*",
            ],
        )

    def _layer(
        self, construct_id: str, provider: cr.Provider, project: codebuild.Project, tag: str, stage: str, compute: str
    ) -> CustomResource:
        resource = CustomResource(
            self,
            construct_id,
            service_token=provider.service_token,
            properties={
                "ProjectName": project.project_name,
                "RepositoryName": self.repository.repository_name,
                "ImageTag": tag,
                "Stage": stage,
                "ComputeType": compute,
            },
        )
        # CloudFormation's ceiling, as an integer (CustomResource's service_timeout renders a string).
        resource.node.default_child.add_property_override("ServiceTimeout", CUSTOM_RESOURCE_MAX_WAIT_S)  # type: ignore[union-attr]
        return resource

    def _provider(self, project: codebuild.Project) -> cr.Provider:
        """Starts a layer's build unless its tag is in ECR, and completes when it has pushed (or fails)."""
        start, provider = build_step_provider(
            self, project=project, start="image_build_start.py", what="image build",
            look="read its CodeBuild log group",
        )  # fmt: skip
        # A tag already in ECR (a rollback to the previous image, a redeploy) is never rebuilt or pushed again.
        self.repository.grant(start, "ecr:DescribeImages")
        return provider


def _registry(scope: Construct) -> str:
    stack = Stack.of(scope)
    return f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}"
