"""Render the boot script. Values may be CDK tokens: they pass through untouched (no filters on them)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jinja2

from catalog import ServingProfile
from launcher.preflight import EX_CONFIG
from runtime import names

USER_DATA_LIMIT = 16 * 1024  # EC2 rejects larger raw user data
TEMPLATE = "boot.sh.j2"

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
    """What an instance runs: the boot script as it renders for this profile, and the image. The script is rendered
    with every deploy-time value (the CDK tokens of BootSettings) at a fixed placeholder, so the id is stable and
    covers every other value the template reads, a new one included, and nothing it does not (a price, a
    description)."""
    text = _render(profile, _FIXED_BOOT)
    return hashlib.sha256(text.encode() + b"\0" + image_tag.encode()).hexdigest()[:16]


def render_user_data(profile: ServingProfile, boot: BootSettings) -> str:
    text = _render(profile, boot)
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text


def template_context(profile: ServingProfile, boot: BootSettings) -> dict[str, Any]:
    """Every value the boot template reads."""
    return {
        "p": profile,
        "boot": boot,
        "n": names,
        "runtime_spec_b64": base64.b64encode(profile.runtime_json().encode()).decode(),
        "gpu": profile.hardware.has_gpu,
        "port": profile.server.port,
        "refusal_exit": EX_CONFIG,
    }


def _render(profile: ServingProfile, boot: BootSettings) -> str:
    return _ENV.get_template(TEMPLATE).render(**template_context(profile, boot))


_FIXED_BOOT = BootSettings(**{f.name: f"<{f.name}>" for f in fields(BootSettings)})
