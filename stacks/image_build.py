"""Build the serving image in region and push it to ECR, during `cdk deploy`, from nothing outside the region.

Two layers, each keyed by its own inputs and each built by CodeBuild under its own custom resource:
- the llama.cpp base (docker/<target>.Dockerfile on Debian root filesystems bootstrapped from a Debian mirror, the
  deploy option debianMirror, with signatures checked against a pinned keyring), tagged `base-<target>-<hash>`:
  only a llama.cpp, flags or root change rebuilds it;
- the application image (docker/app.Dockerfile: the runtime packages on that base), tagged `<target>-<hash>`.
  Profile fields the image never reads (prices, descriptions) are left out of its hash, so editing them
  rebuilds nothing and replaces no instance.
What the builder would otherwise download (the pinned llama.cpp sdist, the runtime wheels, debootstrap) is staged before
deploy by scripts/stage-image-sources.sh and travels in a second S3 asset; synth only reads and checks it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
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
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_s3_assets as s3_assets
from aws_cdk import custom_resources as cr
from constructs import Construct, IConstruct

from catalog.errors import ProfileError
from catalog.hardware import Architecture
from catalog.images import (
    APP_DOCKERFILE,
    ARM64_BUILDERS,
    BUILD_POLL_INTERVAL_S,
    CUSTOM_RESOURCE_MAX_WAIT_S,
    DEFAULT_ARM64_BUILDER,
    DEFAULT_DEBIAN_MIRROR,
    LAYER_BUILD_TIMEOUT_MIN,
    ImageTarget,
)
from runtime import names
from stacks.nag import acknowledge, arn_of

ROOT = Path(__file__).resolve().parent.parent
DOCKER = ROOT / "docker"
# The source asset: Dockerfiles and build scripts, and the packages that run inside the container.
# The catalog is not among them: the container needs the runtime spec, the server flags and the shared names
# only (the `runtime` package), so editing a profile, a price or a description rebuilds nothing.
APP_PACKAGES = ("runtime", "modelfetch", "launcher", "fleetmetrics", "latencyproxy")
BUILD_CONTEXT = ("docker", *APP_PACKAGES)
# Anchored patterns: "*" alone would also match every file inside the re-included folders (an empty asset).
CONTEXT_EXCLUDE = [
    "/*",
    *(f"!/{d}/" for d in BUILD_CONTEXT),
    "__pycache__/",
    "*.pyc",
]
HANDLERS = Path(__file__).resolve().parent / "handlers"
# What a base image is made of besides its Dockerfile: the roots' bootstrap, the pinned keyring and debootstrap,
# the source fetch and the self-check (the mirror is not: every mirror serves the same signed release).
BASE_INPUTS = (
    "bootstrap-base.sh",
    "debian-sources.txt",
    "keyrings/debian-trixie.gpg",
    "fetch-llama-source.py",
    "selfcheck.py",
)
# Build arguments the build script sets itself, never a user.
RESERVED_BUILD_ARGS = frozenset({"LLAMA_BASE", "CHECK_IMAGE"})
_MIRROR = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%+-]+)*/?$")
_ARG_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Printable ASCII without whitespace, quotes, backslash, $ or backtick: URLs and image references fit.
_ARG_VALUE = re.compile(r"^[!#%&(-\[\]-_a-~]+$")
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$")
_ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.[^/]+/([a-z0-9._/-]+?)(:[A-Za-z0-9._-]+)?(@sha256:.*)?$")

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


def default_sources_dir() -> Path:
    """Where scripts/stage-image-sources.sh stages the llama.cpp sdist and wheels (outside the checkout)."""
    xdg = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return Path(os.environ.get("LLAMA_SERVER_CACHE") or xdg / names.LOCAL_CACHE) / "image-sources"


class ImageBuild(Construct):
    """An ECR repository, a CodeBuild project and two custom resources that build the image during deploy.

    target: the image target (catalog.images.IMAGE_TARGETS).
    build_args: NAME=value Docker build arguments (-c imageBuildArgs), checked here; default none.
    sources_dir: the staged llama.cpp sdist, wheels and debootstrap; default default_sources_dir().
    arm64_builder: "cross" (x86 CodeBuild with a cross compiler, offered wherever CodeBuild is) or "native"
        (CodeBuild ARM_CONTAINER, where the region offers it); default "cross". Ignored for x86 targets.
    debian_mirror: the Debian mirror the roots are bootstrapped from (http or https); default
        catalog.images.DEFAULT_DEBIAN_MIRROR.
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
        debian_mirror: str = DEFAULT_DEBIAN_MIRROR,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)
        if arm64_builder not in ARM64_BUILDERS:
            raise ProfileError(f"arm64 builder {arm64_builder!r}: use one of {', '.join(ARM64_BUILDERS)}")
        check_debian_mirror(debian_mirror)
        arm = target.architecture == Architecture.ARM64
        check_build_args(target, build_args or {})
        args = dict(build_args or {})
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
                ecr.LifecycleRule(rule_priority=2, max_image_count=10, description="keep the last ten images"),
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        context = s3_assets.Asset(
            self, "Context", path=str(ROOT), ignore_mode=IgnoreMode.GIT, exclude=list(CONTEXT_EXCLUDE)
        )
        staged = check_staged_sources(sources_dir or default_sources_dir())
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
        self.base_tag = f"base-{target.name}-{base_key(target, args)}"
        self.image_tag = f"{target.name}-{app_key(self.base_tag, args)}"
        self.image_uri = self.repository.repository_uri_for_tag(self.image_tag)
        self.registry = _registry(self)

        key = kms.Key(self, "BuildKey", enable_key_rotation=True, description="CodeBuild artifacts and logs")
        project = codebuild.Project(
            self,
            "Project",
            description=f"llama.cpp image {target.name}: docker/{target.dockerfile}, then docker/{APP_DOCKERFILE}",
            source=codebuild.Source.s3(bucket=context.bucket, path=context.s3_object_key),
            secondary_sources=[
                codebuild.Source.s3(bucket=sources.bucket, path=sources.s3_object_key, identifier="sources")
            ],
            build_spec=codebuild.BuildSpec.from_object(_BUILD_SPEC),
            environment=codebuild.BuildEnvironment(
                build_image=(
                    codebuild.LinuxArmBuildImage.AMAZON_LINUX_2023_STANDARD_3_0
                    if arm and arm64_builder == "native"
                    else codebuild.LinuxBuildImage.AMAZON_LINUX_2023_5
                ),
                compute_type=codebuild.ComputeType.LARGE,
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
                    "DEBIAN_MIRROR": debian_mirror.rstrip("/"),
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
        self.repository.grant_pull_push(project)
        # The build's "tag exists, skip" check: without it every rebuild of an existing tag fails to push.
        self.repository.grant(project, "ecr:DescribeImages")
        for repository_arn in _foreign_ecr_repositories(self, args):
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
        project_id = stack.get_logical_id(project.node.default_child)  # type: ignore[arg-type]
        region = stack.region
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
                f"Resource::arn:{stack.partition}:logs:{region}:<AWS::AccountId>:log-group:/aws/codebuild/"
                f"<{project_id}>:*",
                f"Resource::arn:{stack.partition}:codebuild:{region}:<AWS::AccountId>:report-group/<{project_id}>-*",
            ],
        )

        provider = self._provider(project)
        base = CustomResource(
            self,
            "BaseBuild",
            service_token=provider.service_token,
            properties={
                "ProjectName": project.project_name,
                "RepositoryName": self.repository.repository_name,
                "ImageTag": self.base_tag,
                "Stage": "base",
            },
        )
        self.build = CustomResource(
            self,
            "Build",
            service_token=provider.service_token,
            properties={
                "ProjectName": project.project_name,
                "RepositoryName": self.repository.repository_name,
                "ImageTag": self.image_tag,
                "Stage": "app",
            },
        )
        self.build.node.add_dependency(base)
        for resource in (base, self.build):
            # CloudFormation's ceiling, as an integer (CustomResource's service_timeout renders a string).
            resource.node.default_child.add_property_override("ServiceTimeout", CUSTOM_RESOURCE_MAX_WAIT_S)  # type: ignore[union-attr]

    def _provider(self, project: codebuild.Project) -> cr.Provider:
        """Starts a layer's build unless its tag is in ECR, and completes when it has pushed (or fails)."""
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
        # A tag already in ECR (a rollback to the previous image, a redeploy) is never rebuilt or pushed again.
        self.repository.grant(handlers["start"], "ecr:DescribeImages")
        provider = cr.Provider(
            self,
            "Provider",
            on_event_handler=handlers["start"],
            is_complete_handler=handlers["is_complete"],
            query_interval=Duration.seconds(BUILD_POLL_INTERVAL_S),
            # Report a failure before CloudFormation's own limit does (it would leave no reason).
            total_timeout=Duration.seconds(CUSTOM_RESOURCE_MAX_WAIT_S - 5 * BUILD_POLL_INTERVAL_S),
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
        return provider


# --- build arguments ---------------------------------------------------------------------------------------


def declared_build_args(dockerfile: str, root: Path = ROOT) -> set[str]:
    """The ARG names a Dockerfile under docker/ declares."""
    return set(re.findall(r"^ARG ([A-Z][A-Z0-9_]*)", (root / "docker" / dockerfile).read_text(), re.M))


def check_build_args(target: ImageTarget, build_args: dict[str, str]) -> dict[str, str]:
    """Refuse a build argument the build would misread, with what to change; returns them unchanged."""
    known = (declared_build_args(target.dockerfile) | declared_build_args(APP_DOCKERFILE)) - RESERVED_BUILD_ARGS
    for name, value in build_args.items():
        where = f"imageBuildArgs {name}={value!r}"
        if not _ARG_NAME.match(name):
            raise ProfileError(f"{where}: a build argument name is upper case letters, digits and _")
        if name not in known:
            raise ProfileError(
                f"{where}: docker/{target.dockerfile} and docker/{APP_DOCKERFILE} declare no {name}; "
                f"use one of {', '.join(sorted(known))}"
            )
        if not value or not value.isascii() or not _ARG_VALUE.match(value):
            raise ProfileError(
                f"{where}: a value must be non-empty printable ASCII without spaces, quotes, backslash, $ or `; "
                "URLs and image references need none of them"
            )
        if name.endswith("_IMAGE") and not _IMAGE_REF.match(value):
            raise ProfileError(f"{where}: write an image reference, e.g. <registry>/<repository>:<tag>@sha256:<digest>")
        if name.endswith("_URL") and not value.startswith("https://"):
            raise ProfileError(f"{where}: use an https:// URL")
    return dict(build_args)


def check_debian_mirror(url: str) -> str:
    """A mirror URL the build script can pass to debootstrap as one word; http is fine (signatures are checked)."""
    if not _MIRROR.match(url):
        raise ProfileError(
            f"debianMirror {url!r}: write the mirror's Debian archive URL, e.g. {DEFAULT_DEBIAN_MIRROR} or "
            "http://deb.debian.org/debian (http or https, no spaces or quotes)"
        )
    return url


def _foreign_ecr_repositories(scope: Construct, args: dict[str, str]) -> list[str]:
    """ARNs of the ECR repositories named by image build arguments (a mirror, an AWS-published image)."""
    arns = []
    for name, value in sorted(args.items()):
        if name.endswith("_IMAGE") and (m := _ECR_IMAGE.match(value)):
            account, region, repository = m.group(1), m.group(2), m.group(3)
            arns.append(
                Stack.of(scope).format_arn(
                    service="ecr", resource="repository", resource_name=repository, account=account, region=region
                )
            )
    return arns


# --- keys: each layer's tag is a hash of what goes into it ---------------------------------------------------


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc")


def base_key(target: ImageTarget, args: dict[str, str], root: Path = ROOT) -> str:
    """llama.cpp base: its Dockerfile (source pin, flags), the roots' inputs, the source fetch, its arguments."""
    h = hashlib.sha256()
    for name in (target.dockerfile, *BASE_INPUTS):
        h.update(name.encode() + b"\0" + (root / "docker" / name).read_bytes() + b"\0")
    h.update(f"{target.platform}\0".encode())
    declared = declared_build_args(target.dockerfile, root)
    h.update(json.dumps({k: v for k, v in sorted(args.items()) if k in declared}).encode())
    return h.hexdigest()[:16]


def app_files(root: Path = ROOT) -> list[Path]:
    """The files the application layer copies: the runtime packages, whole."""
    return [path for package in APP_PACKAGES for path in _files(root / package)]


def app_key(base_tag: str, args: dict[str, str], root: Path = ROOT) -> str:
    """Application image: the base, the app Dockerfile, the wheels, the build script, its check, the files it copies."""
    h = hashlib.sha256(base_tag.encode() + b"\0")
    for name in (APP_DOCKERFILE, "requirements-image.txt", "build-image.sh", "selfcheck.py"):
        h.update(name.encode() + b"\0" + (root / "docker" / name).read_bytes() + b"\0")
    for path in app_files(root):
        h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    declared = declared_build_args(APP_DOCKERFILE, root)
    h.update(json.dumps({k: v for k, v in sorted(args.items()) if k in declared}).encode())
    return h.hexdigest()[:16]


# --- staged sources ------------------------------------------------------------------------------------------


class StagedSources:
    """The staged directory, a digest of its pinned contents (the asset hash), and what is wrong with it."""

    def __init__(self, path: Path, digest: str, problems: list[str]) -> None:
        self.path, self.digest, self.problems = path, digest, problems


def pinned_sources() -> dict[str, str]:
    """sha256 of each file the build needs from outside the region: the llama.cpp sdist, every wheel, debootstrap."""
    dockerfile = (DOCKER / "x86-64-cpu.Dockerfile").read_text()
    version = re.search(r"^ARG LLAMA_CPP_PYTHON_VERSION=(\S+)$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    sha = re.search(r"^ARG LLAMA_CPP_PYTHON_SHA256=([0-9a-f]{64})$", dockerfile, re.M).group(1)  # type: ignore[union-attr]
    pins = {f"llama_cpp_python-{version}.tar.gz": sha}
    for line in (DOCKER / "requirements-image.txt").read_text().splitlines():
        if m := re.match(r"^(\S+)==(\S+) --hash=sha256:([0-9a-f]{64})$", line):
            pins[f"wheels/{m.group(1)}=={m.group(2)}"] = m.group(3)
    for line in (DOCKER / "debian-sources.txt").read_text().splitlines():
        if m := re.match(r"^\S+/(\S+\.deb) ([0-9a-f]{64})$", line):
            pins[f"debian/{m.group(1)}"] = m.group(2)
    return pins


def check_staged_sources(path: Path) -> StagedSources:
    """Everything staged is pinned, so the asset hash is a digest of the pins; nothing comes from this machine's OS."""
    pins = pinned_sources()
    digest = hashlib.sha256(json.dumps(pins, sort_keys=True).encode()).hexdigest()
    problems = []
    if not path.is_dir():
        problems = [f"{path} does not exist"]
    else:
        for name in (k for k in pins if not k.startswith("wheels/")):
            if _sha256(path / name) != pins[name]:
                problems.append(f"{path / name} is missing or not sha256 {pins[name]}")
        wheel_hashes = {_sha256(w) for w in (path / "wheels").glob("*.whl")}
        missing = sorted(k for k, v in pins.items() if k.startswith("wheels/") and v not in wheel_hashes)
        if missing:
            problems.append(f"{path / 'wheels'} lacks {', '.join(m.removeprefix('wheels/') for m in missing)}")
    if problems:
        # Same template shape without them; `cdk deploy` refuses on the error annotation.
        return StagedSources(DOCKER / "unstaged", hashlib.sha256(b"unstaged").hexdigest(), problems)
    return StagedSources(path, digest, [])


def _sha256(path: Path) -> str | None:
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return _sha256_cached(str(path), st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=64)
def _sha256_cached(path: str, size: int, mtime_ns: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _registry(scope: Construct) -> str:
    stack = Stack.of(scope)
    return f"{stack.account}.dkr.ecr.{stack.region}.{stack.url_suffix}"


def _framework_functions(provider: cr.Provider) -> list[IConstruct]:
    return [c for c in provider.node.find_all() if isinstance(c, lambda_.Function) and "framework-" in c.node.id]
