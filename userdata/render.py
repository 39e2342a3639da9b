"""Render the boot script. Values may be CDK tokens: they pass through untouched (no filters on them)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path

import jinja2

from catalog import ServingProfile, names
from launcher.preflight import EX_CONFIG

USER_DATA_LIMIT = 16 * 1024  # EC2 rejects larger raw user data

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - shell, not HTML
)


@dataclass(frozen=True)
class BootSettings:
    """Deploy-time values the stack knows; each may be a CDK token."""

    region: str
    stack_name: str
    group_logical_id: str
    image_uri: str
    registry: str
    api_key_secret_arn: str
    model_cache_url: str
    log_group: str
    metrics_namespace: str
    lifecycle_hook: str
    release: str  # this launch template's release_id; a warm-pool instance compares it with the parameter below
    release_parameter: str  # SSM parameter holding the group's current release


def release_id(profile: ServingProfile, image_tag: str) -> str:
    """What an instance runs: the profile, the image and this boot script. Tokens stay out, so it is stable."""
    template = (Path(__file__).parent / "templates" / "boot.sh.j2").read_bytes()
    digest = hashlib.sha256(profile.runtime_json().encode() + b"\0" + image_tag.encode() + b"\0" + template)
    return digest.hexdigest()[:16]


def render_user_data(profile: ServingProfile, boot: BootSettings) -> str:
    text = _ENV.get_template("boot.sh.j2").render(
        p=profile,
        boot=boot,
        n=names,
        runtime_spec_b64=base64.b64encode(profile.runtime_json().encode()).decode(),
        gpu=profile.hardware.has_gpu,
        port=profile.server.port,
        refusal_exit=EX_CONFIG,
    )
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text
