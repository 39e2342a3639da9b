"""Checks on what a user may pass to the image build: Docker build arguments (-c imageBuildArgs) and the Debian
mirrors (-c debianMirrors). Each refusal says what to write instead."""

from __future__ import annotations

import re

from aws_cdk import Stack
from constructs import Construct

from gguf_serve.catalog.images import APP_DOCKERFILE, DEFAULT_DEBIAN_MIRRORS, ImageTarget
from stacks.errors import PropsError
from stacks.image_inputs import declared_build_args

# Build arguments the build script sets itself, never a user.
RESERVED_BUILD_ARGS = frozenset({"LLAMA_BASE", "CHECK_IMAGE"})
_MIRROR = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%+-]+)*/?$")
_ARG_NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")
# Printable ASCII without whitespace, quotes, backslash, $ or backtick: URLs and image references fit.
_ARG_VALUE = re.compile(r"^[!#%&(-\[\]-_a-~]+$")
_IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9.-]*(:[0-9]+)?(/[a-z0-9._-]+)+(:[A-Za-z0-9._-]+)?(@sha256:[0-9a-f]{64})?$")
ECR_IMAGE = re.compile(r"^(\d{12})\.dkr\.ecr\.([a-z0-9-]+)\.[^/]+/([a-z0-9._/-]+?)(:[A-Za-z0-9._-]+)?(@sha256:.*)?$")


def check_build_args(target: ImageTarget, build_args: dict[str, str]) -> dict[str, str]:
    """Refuse a build argument the build would misread, with what to change; returns them unchanged."""
    known = (declared_build_args(target.dockerfile) | declared_build_args(APP_DOCKERFILE)) - RESERVED_BUILD_ARGS
    for name, value in build_args.items():
        where = f"imageBuildArgs {name}={value!r}"
        if not _ARG_NAME.match(name):
            raise PropsError(f"{where}: a build argument name is upper case letters, digits and _")
        if name not in known:
            raise PropsError(
                f"{where}: docker/{target.dockerfile} and docker/{APP_DOCKERFILE} declare no {name}; "
                f"use one of {', '.join(sorted(known))}"
            )
        if not value or not value.isascii() or not _ARG_VALUE.match(value):
            raise PropsError(
                f"{where}: a value must be non-empty printable ASCII without spaces, quotes, backslash, $ or `; "
                "URLs and image references need none of them"
            )
        if name.endswith("_IMAGE") and not _IMAGE_REF.match(value):
            raise PropsError(f"{where}: write an image reference, e.g. <registry>/<repository>:<tag>@sha256:<digest>")
        if name.endswith("_URL") and not value.startswith("https://"):
            raise PropsError(f"{where}: use an https:// URL")
    return dict(build_args)


def check_debian_mirrors(urls: tuple[str, ...]) -> tuple[str, ...]:
    """Mirror URLs the build script can pass to debootstrap one word each; http is fine (signatures are checked)."""
    if not urls:
        raise PropsError(f"debianMirrors is empty: list at least one, e.g. {DEFAULT_DEBIAN_MIRRORS[0]}")
    for url in urls:
        if not _MIRROR.match(url):
            raise PropsError(
                f"debianMirrors {url!r}: write the mirror's Debian archive URL, e.g. {DEFAULT_DEBIAN_MIRRORS[0]} or "
                "http://deb.debian.org/debian (http or https, no spaces or quotes)"
            )
    return tuple(u.rstrip("/") for u in urls)


def foreign_ecr_repositories(scope: Construct, args: dict[str, str]) -> list[str]:
    """ARNs of the ECR repositories named by image build arguments (a mirror, an AWS-published image)."""
    arns = []
    for name, value in sorted(args.items()):
        if name.endswith("_IMAGE") and (m := ECR_IMAGE.match(value)):
            account, region, repository = m.group(1), m.group(2), m.group(3)
            arns.append(
                Stack.of(scope).format_arn(
                    service="ecr", resource="repository", resource_name=repository, account=account, region=region
                )
            )
    return arns
