"""Render the boot script. Values may be CDK tokens: quoting wraps them whole and never changes their text.

Every value from a profile or the stack reaches the script through the `sh` filter (shell quoting, as
guardian/cdk's user-data builder quotes its parts) once, into a variable; the script and the units it writes use
the variables. Profile values are also held to the hub's characters (InstanceSpec), so no quoting is the only guard.
"""

from __future__ import annotations

import base64
import hashlib
import re
import shlex
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import jinja2

from gguf_serve.catalog import ProfileError, ServingProfile
from gguf_serve.catalog.names import HUB_SHAPES
from gguf_serve.container import names
from gguf_serve.container.launch.preflight import EX_CONFIG

USER_DATA_LIMIT = 16 * 1024  # EC2 rejects larger raw user data
TEMPLATE = "boot.sh.j2"

_ENV = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    undefined=jinja2.StrictUndefined,
    keep_trailing_newline=True,
    autoescape=False,  # noqa: S701 - shell, not HTML
)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


def shell_quote(value: object) -> str:
    """One shell word whatever the value (shlex.quote); a control character (a newline ends a comment or a heredoc
    line) is refused rather than quoted."""
    text = str(value)
    if _CONTROL.search(text):
        raise ValueError(f"{text!r} holds a control character: not a value for the boot script")
    return shlex.quote(text)


_ENV.filters["sh"] = shell_quote


@dataclass(frozen=True)
class DeploySettings:
    """Deploy-time values the stack knows (the image, the API key, the model cache, the log group); CDK tokens."""

    region: str
    stack_name: str
    image_uri: str
    registry: str
    api_key_secret_arn: str
    model_cache_url: str
    log_group: str
    metrics_namespace: str
    route_url: str  # the shared load balancer's route listener (sharedEndpoint); "" when the stack has its own


@dataclass(frozen=True)
class BootSettings(DeploySettings):
    """... and what the fleet adds: its group, its launch hook and its release."""

    group_logical_id: str
    lifecycle_hook: str
    release: str  # this launch template's release_id; a warm-pool instance compares it with the parameter below
    release_parameter: str  # SSM parameter holding the group's current release


@dataclass(frozen=True)
class InstanceSpec:
    """What the boot script reads from a profile, and nothing else: the fleet gets this, never the profile, so a
    price or a description edit cannot reach an instance."""

    name: str  # the profile's name (the script's header)
    stack_name: str
    model_repo: str
    model_file: str
    port: int  # the hop's port on the instance (the load balancer's target port)
    parallel: int  # llama-server's slots (the metrics publisher's --slots)
    gpu: bool
    model_load_s: int  # how long the ready unit waits for /health 200
    drain_deadline_s: int  # the hop's drain deadline
    runtime_json: str  # /etc/gguf-serve/runtime.json: the runtime spec the launcher starts llama-server from
    # The models the other fleets behind a shared endpoint serve: the hop forwards a request naming one of them
    # to the shared load balancer's route listener (--route NAME=<route_url>); () when the stack has its own
    routed_models: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for key in ("name", "model_repo", "model_file"):
            test, allowed = HUB_SHAPES[key.removeprefix("model_")]
            if not test(getattr(self, key)):
                raise ProfileError(f"InstanceSpec: {key} {getattr(self, key)!r} is not allowed; allowed: {allowed}")
        test, allowed = HUB_SHAPES["name"]
        for model in self.routed_models:
            if not test(model):
                raise ProfileError(f"InstanceSpec: routed model {model!r} is not allowed; allowed: {allowed}")
        if not (self.stack_name.isascii() and self.stack_name.isalnum()):
            raise ProfileError(f"InstanceSpec: stack_name {self.stack_name!r} must be letters and digits")

    @classmethod
    def of(cls, profile: ServingProfile, routed_models: tuple[str, ...] = ()) -> InstanceSpec:
        """routed_models: the other fleets' models at this stack's shared endpoint (none: its own endpoint)."""
        return cls(
            name=profile.name,
            stack_name=profile.stack_name,
            model_repo=profile.model.repo,
            model_file=profile.model.file,
            port=profile.server.port,
            parallel=profile.server.parallel,
            gpu=profile.hardware.has_gpu,
            model_load_s=profile.fleet.boot.model_load_s,
            drain_deadline_s=profile.fleet.drain.deadline_s,
            runtime_json=profile.runtime_json(),
            routed_models=routed_models,
        )


def release_id(instance: InstanceSpec, image_tag: str) -> str:
    """What an instance runs: the boot script as it renders for this spec, and the image. The script is rendered
    with every deploy-time value (the CDK tokens of BootSettings) at a fixed placeholder, so the id is stable and
    covers every other value the template reads, a new one included."""
    text = _render(instance, _FIXED_BOOT)
    return hashlib.sha256(text.encode() + b"\0" + image_tag.encode()).hexdigest()[:16]


def render_user_data(instance: InstanceSpec, boot: BootSettings) -> str:
    text = _render(instance, boot)
    if len(text.encode()) > USER_DATA_LIMIT:
        raise ValueError(f"user data is {len(text.encode())} bytes; EC2 allows {USER_DATA_LIMIT}")
    return text


def template_context(instance: InstanceSpec, boot: BootSettings) -> dict[str, Any]:
    """Every value the boot template reads."""
    return {
        "i": instance,
        "boot": boot,
        "n": names,
        "runtime_spec_b64": base64.b64encode(instance.runtime_json.encode()).decode(),
        "refusal_exit": EX_CONFIG,
    }


def _render(instance: InstanceSpec, boot: BootSettings) -> str:
    return _ENV.get_template(TEMPLATE).render(**template_context(instance, boot))


_FIXED_BOOT = BootSettings(**{f.name: f"<{f.name}>" for f in fields(BootSettings)})
