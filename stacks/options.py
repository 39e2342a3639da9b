"""Deploy options: committed in deploy.toml, read by every `cdk synth|deploy`; `-c name=value` overrides one run.

Each option has one name, used both as the deploy.toml key and as the `-c` context key. Values are checked here,
before any construct is built, and a bad one fails synth with what to change.
"""

from __future__ import annotations

import ipaddress
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_serve.catalog.images import ARM64_BUILDERS, DEFAULT_ARM64_BUILDER, DEFAULT_DEBIAN_MIRRORS
from gguf_serve.errors import InputError

DEPLOY_CONFIG = Path(__file__).resolve().parent.parent / "deploy.toml"

# The widest caller range accepted for the internal ALB: a /8 (e.g. 10.0.0.0/8). Wider ranges, however they are
# split (0.0.0.0/1 + 128.0.0.0/1), open the API to whole swaths of the address space.
MAX_CALLER_ADDRESSES = 2**24

# ACM: arn:${Partition}:acm:${Region}:${Account}:certificate/${CertificateId}; IAM server certificates (China's
# usual choice, ACM issues no public certificates there): arn:${Partition}:iam::${Account}:server-certificate/${Name}.
# Source: Service Authorization Reference, "Resource types defined by AWS Certificate Manager" and "... by IAM".
# An ALB takes an ACM certificate from its own region only (ELB docs, "SSL certificates for your Application
# Load Balancer").
_ACM_ARN = re.compile(r"^arn:(?P<partition>aws[a-z-]*):acm:(?P<region>[a-z0-9-]+):\d{12}:certificate/[0-9a-f-]{36}$")
_IAM_CERT_ARN = re.compile(r"^arn:(?P<partition>aws[a-z-]*):iam::\d{12}:server-certificate/[\w+=,.@/-]{1,128}$")
_BUILD_ARG_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

OPTION_NAMES = (
    "region",
    "account",
    "allowedCidrs",
    "certificateArn",
    "spot",
    "offHours",
    "warmPool",
    "minCapacity",
    "wakeOnRequest",
    "imageBuildArgs",
    "arm64Builder",
    "debianMirrors",
    "allowTypedLock",
    "eksProfiles",
    "eksAdminRoles",
    "sagemakerUnlistedTypes",
    "sagemakerScalingMetric",
    "sagemakerInferenceAmi",
    "eksAutoModeFields",
    "sharedEndpoint",
)
# Fallbacks for what only the service refuses, late in a deploy (docs/first-deploy.md, "Refused late"): which
# signal SageMaker endpoints scale on. "concurrency": SageMaker's own high-resolution ConcurrentRequestsPerModel;
# "slots": the container's busy-slot ratio, which it writes to its log (EMF), for a region whose Application Auto
# Scaling refuses the high-resolution predefined metric.
SAGEMAKER_SCALING_METRICS = ("concurrency", "slots")


class DeployOptionError(InputError):
    """A deploy option that cannot work; the message names the option and what to write instead."""


@dataclass(frozen=True)
class DeployOptions:
    region: str = "cn-northwest-1"
    account: str | None = None  # None: the account of the credentials, resolved by CloudFormation at deploy
    allowed_cidrs: tuple[str, ...] = ()  # who may call the internal ALB; empty: the VPC only
    certificate_arn: str | None = None  # HTTPS on 443 with this certificate; None: HTTP on 80 inside the VPC
    spot: bool = False  # CPU stacks: all Spot, capacity-optimized, with capacity rebalancing
    off_hours: tuple[int, int] | None = None  # (stop, start) hours, weekdays, Asia/Shanghai: scale to zero
    warm_pool: int | None = None  # stopped instances that hold the verified model; 0: none; None: the profile's
    min_capacity: int | None = None  # instances always running; 0: none between requests; None: the profile's
    wake_on_request: bool = False  # a group at zero scales to one on the first request (ALB 503 -> alarm)
    image_build_args: dict[str, str] = field(default_factory=dict)  # extra `docker build --build-arg`s
    arm64_builder: str = DEFAULT_ARM64_BUILDER  # "cross": x86 CodeBuild, cross-compiled; "native": ARM_CONTAINER
    debian_mirrors: tuple[str, ...] = DEFAULT_DEBIAN_MIRRORS  # the roots' mirrors, probed in order; any: signed
    allow_typed_lock: bool = False  # deploy a model whose sha256 was typed, never checked against a listing
    eks_profiles: tuple[str, ...] = ()  # serving profiles of EksServingStack (docs/eks.md); empty: no EKS stack
    eks_admin_roles: tuple[str, ...] = ()  # IAM role ARNs given cluster-admin access entries on the EKS cluster
    # SageMaker stacks on ml types their region's pinned list lacks (profiles/sagemaker-hosted.toml) deploy anyway:
    # for an account whose endpoint quota for the type the pre-flight found (the list lags the region, or is wrong)
    sagemaker_unlisted_types: bool = False
    sagemaker_scaling_metric: str = "concurrency"  # SAGEMAKER_SCALING_METRICS
    sagemaker_inference_ami: bool = True  # false: GPU variants name no InferenceAmiVersion (the region's default)
    eks_auto_mode_fields: bool = True  # false: the cluster's disabled Auto Mode fields are left out of CreateCluster
    # EC2 stacks behind one internal load balancer (SharedEndpointStack, docs/deploying.md); empty: one ALB each
    shared_endpoint: tuple[str, ...] = ()


# Options renamed: the old name is refused with the new one, never silently ignored.
RENAMED = {"debianMirror": "debianMirrors (a list of mirrors, probed in order)"}


def load_options(context: dict[str, Any], config_file: Path = DEPLOY_CONFIG) -> DeployOptions:
    """deploy.toml, then any `-c` value of the same name on top; every value checked."""
    for old, new in RENAMED.items():
        if context.get(old) is not None:
            raise DeployOptionError(f"-c {old} is now {new}; write -c {old}s=<url>,<url>")
    committed = _read_config(config_file)
    raw = {**committed, **{k: context[k] for k in OPTION_NAMES if context.get(k) is not None}}
    where = {k: ("-c" if context.get(k) is not None else config_file.name) for k in raw}
    try:
        region = _text(raw.get("region", DeployOptions.region), "region") or DeployOptions.region
        options = DeployOptions(
            region=region,
            account=_account(raw.get("account")),
            allowed_cidrs=_cidrs(raw.get("allowedCidrs")),
            certificate_arn=_certificate(raw.get("certificateArn"), region),
            spot=_flag(raw.get("spot"), "spot"),
            off_hours=_off_hours(raw.get("offHours")),
            warm_pool=_count(raw["warmPool"], "warmPool") if "warmPool" in raw else None,
            min_capacity=_count(raw["minCapacity"], "minCapacity") if "minCapacity" in raw else None,
            wake_on_request=_flag(raw.get("wakeOnRequest"), "wakeOnRequest"),
            image_build_args=_build_args(raw.get("imageBuildArgs")),
            arm64_builder=_choice(raw.get("arm64Builder", DEFAULT_ARM64_BUILDER), "arm64Builder", ARM64_BUILDERS),
            debian_mirrors=_mirrors(raw.get("debianMirrors")),
            allow_typed_lock=_flag(raw.get("allowTypedLock"), "allowTypedLock"),
            eks_profiles=_names(raw.get("eksProfiles"), "eksProfiles"),
            eks_admin_roles=_names(raw.get("eksAdminRoles"), "eksAdminRoles"),
            sagemaker_unlisted_types=_flag(raw.get("sagemakerUnlistedTypes"), "sagemakerUnlistedTypes"),
            sagemaker_scaling_metric=_choice(
                raw.get("sagemakerScalingMetric", "concurrency"), "sagemakerScalingMetric", SAGEMAKER_SCALING_METRICS
            ),
            sagemaker_inference_ami=_flag(raw.get("sagemakerInferenceAmi", True), "sagemakerInferenceAmi"),
            eks_auto_mode_fields=_flag(raw.get("eksAutoModeFields", True), "eksAutoModeFields"),
            shared_endpoint=_shared(raw.get("sharedEndpoint")),
        )
        if options.shared_endpoint and options.wake_on_request:
            raise _Bad(
                "sharedEndpoint",
                "a shared load balancer cannot wake one fleet: its 503s with no target (what wakes a group) do not say "
                "which fleet's model was asked for; drop wakeOnRequest, or deploy the sleeping stack on its own",
            )
        if options.wake_on_request and options.off_hours is None and options.min_capacity != 0:
            raise _Bad(
                "wakeOnRequest", "nothing to wake: the group is never at zero; add -c offHours=20-8 or -c minCapacity=0"
            )
    except _Bad as bad:
        raise DeployOptionError(f"{bad.option} (from {where.get(bad.option, 'default')}): {bad}") from None
    return options


class _Bad(ValueError):
    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


def _read_config(path: Path) -> dict[str, Any]:
    if not path.exists():
        return {}
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise DeployOptionError(f"{path.name} is not valid TOML: {e}") from None
    for old, new in RENAMED.items():
        if old in data:
            raise DeployOptionError(f'{path.name}: {old} is now {new}; write {old}s = ["<url>", ...]')
    unknown = sorted(set(data) - set(OPTION_NAMES))
    if unknown:
        raise DeployOptionError(f"{path.name}: unknown option(s) {unknown}; the options are {list(OPTION_NAMES)}")
    return data


def _text(value: Any, option: str) -> str:
    if not isinstance(value, str):
        raise _Bad(option, f"expected text, got {value!r}")
    return value.strip()


def _account(value: Any) -> str | None:
    if value in (None, ""):
        return None
    text = str(value).strip()
    if not re.fullmatch(r"\d{12}", text):
        raise _Bad("account", f"{text!r} is not a 12-digit AWS account id; leave it empty to use the credentials'")
    return text


def _choice(value: Any, option: str, choices: tuple[str, ...] | frozenset[str]) -> str:
    text = str(value).strip()
    if text not in choices:
        raise _Bad(option, f"{text!r}: use one of {', '.join(sorted(choices))}")
    return text


def _flag(value: Any, option: str) -> bool:
    if value is None or isinstance(value, bool):
        return bool(value)
    text = str(value).strip().lower()
    if text in ("true", "false"):
        return text == "true"
    raise _Bad(option, f"{value!r} is not true or false; write -c {option}=true")


def _count(value: Any, option: str) -> int:
    try:
        n = int(str(value).strip())
    except ValueError:
        raise _Bad(option, f"{value!r} is not a whole number; write e.g. -c {option}=1 (0 turns it off)") from None
    if not 0 <= n <= 10:
        raise _Bad(option, f"{n} is out of range 0-10")
    return n


def _cidrs(value: Any) -> tuple[str, ...]:
    if value in (None, "", []):
        return ()
    items = value if isinstance(value, list) else str(value).split(",")
    networks = []
    for item in (str(i).strip() for i in items):
        if not item:
            continue
        try:
            net = ipaddress.ip_network(item, strict=True)
        except ValueError as e:
            hint = ""
            if "host bits" in str(e):
                hint = f"; did you mean {ipaddress.ip_network(item, strict=False)}?"
            raise _Bad("allowedCidrs", f"{item!r} is not an IPv4 network ({e}){hint}") from None
        if net.version != 4:
            raise _Bad("allowedCidrs", f"{item} is IPv6; the load balancer's callers are listed as IPv4 networks")
        networks.append(net)
    covered = sum(n.num_addresses for n in ipaddress.collapse_addresses(networks))
    if covered > MAX_CALLER_ADDRESSES:
        raise _Bad(
            "allowedCidrs",
            f"{','.join(map(str, networks))} admits {covered:,} addresses, more than a /8; the API has one shared key, "
            "so list only your own networks (e.g. 10.8.0.0/16)",
        )
    return tuple(str(n) for n in networks)


def _certificate(value: Any, region: str) -> str | None:
    if value in (None, ""):
        return None
    arn = str(value).strip()
    partition = "aws-cn" if region.startswith("cn-") else "aws"
    if m := _ACM_ARN.match(arn):
        if m["region"] != region:
            raise _Bad("certificateArn", f"the certificate is in {m['region']} but the load balancer is in {region}")
    elif not (m := _IAM_CERT_ARN.match(arn)):
        raise _Bad(
            "certificateArn",
            f"{arn!r} is not a certificate ARN; write arn:{partition}:acm:{region}:<account>:certificate/<id> or "
            f"arn:{partition}:iam::<account>:server-certificate/<name>",
        )
    if m["partition"] != partition:
        raise _Bad("certificateArn", f"partition {m['partition']!r} is not {region}'s ({partition!r})")
    return arn


def _off_hours(value: Any) -> tuple[int, int] | None:
    if value in (None, ""):
        return None
    try:
        stop, start = (int(h) for h in str(value).split("-"))
    except ValueError:
        raise _Bad("offHours", f"{value!r}: write it as STOP-START hours, e.g. -c offHours=20-8") from None
    if not (0 <= stop <= 23 and 0 <= start <= 23):
        raise _Bad("offHours", f"{value!r}: hours are 0-23, e.g. -c offHours=20-8")
    if stop == start:
        raise _Bad("offHours", f"{value!r}: stop and start at the same hour would fight; e.g. -c offHours=20-8")
    return stop, start


def _names(value: Any, option: str) -> tuple[str, ...]:
    """A list in deploy.toml, or -c name=a,b."""
    if value in (None, "", []):
        return ()
    items = value if isinstance(value, list) else str(value).split(",")
    names = tuple(str(i).strip() for i in items if str(i).strip())
    if any(any(c.isspace() for c in n) for n in names):
        raise _Bad(option, f"{value!r}: names hold no spaces; write e.g. -c {option}=a,b")
    return names


def _shared(value: Any) -> tuple[str, ...]:
    """The EC2 stacks behind one endpoint, in order: the first one's fleet serves a request that names no model."""
    stacks = _names(value, "sharedEndpoint")
    if len(set(stacks)) != len(stacks):
        raise _Bad("sharedEndpoint", f"{', '.join(stacks)}: a stack is listed twice")
    if len(stacks) == 1:
        raise _Bad("sharedEndpoint", f"only {stacks[0]}: list two or more stacks, e.g. -c sharedEndpoint="
                   "GravitonMoeStack,GpuMtpStack, or none (each stack its own load balancer)")  # fmt: skip
    return stacks


def _mirrors(value: Any) -> tuple[str, ...]:
    """Debian mirrors' archive URLs, in the order the build probes them; http is fine: the build checks the
    release's signatures, not the transport."""
    if value in (None, "", []):
        return DEFAULT_DEBIAN_MIRRORS
    items = value if isinstance(value, list) else str(value).split(",")
    urls = tuple(str(u).strip().rstrip("/") for u in items if str(u).strip())
    for url in urls:
        if not re.fullmatch(r"https?://[A-Za-z0-9.-]+(:[0-9]+)?(/[A-Za-z0-9._~%+-]+)*", url):
            raise _Bad(
                "debianMirrors",
                f"{url!r} is not a mirror URL; write e.g. -c debianMirrors={DEFAULT_DEBIAN_MIRRORS[0]},"
                f"{DEFAULT_DEBIAN_MIRRORS[1]} (http:// or https://, the directory that holds dists/ and pool/)",
            )
    return urls


def _build_args(value: Any) -> dict[str, str]:
    """-c imageBuildArgs=NAME=value,NAME=value, or a table in deploy.toml."""
    if value in (None, "", {}):
        return {}
    if isinstance(value, dict):
        pairs = [(str(k), str(v)) for k, v in value.items()]
    else:
        split = [p.split("=", 1) for p in str(value).split(",") if p.strip()]
        if any(len(p) != 2 for p in split):
            raise _Bad("imageBuildArgs", f"{value!r}: write NAME=value pairs separated by commas")
        pairs = [(k, v) for k, v in split]
    args = {}
    for name, val in ((k.strip(), v.strip()) for k, v in pairs):
        if not _BUILD_ARG_NAME.match(name):
            raise _Bad("imageBuildArgs", f"{name!r} is not a build-arg name (letters, digits, _): write NAME=value")
        if any(c.isspace() for c in val) or not val:
            raise _Bad("imageBuildArgs", f"{name}={val!r}: a value must be non-empty and hold no spaces")
        args[name] = val
    return args
