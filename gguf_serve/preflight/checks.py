"""Each check reads the account (Describe/Get/List only) and says what to do when it falls short."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.preflight.network import endpoint_services, network_quotas
from gguf_serve.preflight.plan import DeployPlan
from gguf_serve.preflight.results import Clients, Result, Status

BOOTSTRAP_STACK = "CDKToolkit"
BOOTSTRAP_VERSION_PARAMETER = "/cdk-bootstrap/hnb659fds/version"  # the default qualifier's version parameter
_SIZES = {
    "BUILD_GENERAL1_SMALL": "Small",
    "BUILD_GENERAL1_MEDIUM": "Medium",
    "BUILD_GENERAL1_LARGE": "Large",
    "BUILD_GENERAL1_XLARGE": "XLarge",
    "BUILD_GENERAL1_2XLARGE": "2XLarge",
}


def run_checks(plan: DeployPlan, client: Clients) -> list[Result]:
    results = [
        Result(f"refused {name}", Status.BLOCKER, why, "as the detail says, then run this again")
        for name, why in plan.refused
    ]
    checks = (ami, instance_offerings, vcpu_quotas, build_environments, bootstrap, endpoint_services, network_quotas,
              lambda_capacity)  # fmt: skip
    for check in checks:
        try:
            results.extend(check(plan, client))
        except (ClientError, BotoCoreError) as e:
            results.append(Result(check.__name__, Status.WARN, f"could not check: {e}", "grant read-only access"))
    return results


def ami(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    ssm, ec2 = client("ssm"), client("ec2")
    for s in plan.stacks:
        name = f"AMI {s.stack_name}"
        try:
            image_id = ssm.get_parameter(Name=s.ami_parameter)["Parameter"]["Value"]
        except ClientError as e:
            if e.response["Error"]["Code"] != "ParameterNotFound":
                raise
            yield Result(
                name,
                Status.BLOCKER,
                f"{s.ami_parameter} does not exist in {plan.region}",
                "pick an AMI parameter published in this region ([ami.*] ssm_parameter in profiles/hardware.toml)",
            )
            continue
        (image,) = ec2.describe_images(ImageIds=[image_id])["Images"]
        root = next(m for m in image["BlockDeviceMappings"] if m["DeviceName"] == image["RootDeviceName"])
        snapshot = root["Ebs"]["VolumeSize"]
        if image["Architecture"] != s.architecture:
            yield Result(
                name,
                Status.BLOCKER,
                f"{image_id} is {image['Architecture']}, {s.instance_type} is {s.architecture}",
                "fix the instance's ami, or that [ami.*] table's ssm_parameter, in profiles/hardware.toml",
            )
        elif not s.root_volume_gib:
            yield Result(name, Status.OK, f"{image_id}: snapshot {snapshot} GiB; the volume is planned once the model "
                         "is locked")  # fmt: skip
        elif snapshot > s.root_volume_gib:
            yield Result(
                name,
                Status.BLOCKER,
                f"{image_id}'s root snapshot is {snapshot} GiB, the volume {s.root_volume_gib} GiB",
                f"set root_snapshot_gib = {snapshot} in that [ami.*] table of profiles/hardware.toml",
            )
        else:
            yield Result(name, Status.OK, f"{image_id}: snapshot {snapshot} GiB <= volume {s.root_volume_gib} GiB")


def _offered_zones(ec2: Any, instance_type: str) -> set[str]:
    return {
        o["Location"]
        for page in ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}]
        )
        for o in page["InstanceTypeOfferings"]
    }


def instance_offerings(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    ec2 = client("ec2")
    for s in plan.stacks:
        offered = _offered_zones(ec2, s.instance_type)
        missing = sorted(set(s.zones) - offered)
        name = f"{s.instance_type} in zones"
        if missing:
            yield Result(
                name,
                Status.BLOCKER,
                f"not offered in {', '.join(missing)} (offered: {', '.join(sorted(offered)) or 'none'})",
                "pin zones that offer it in cdk.context.json 'pinned-availability-zones'",
            )
        else:
            yield Result(name, Status.OK, f"offered in {', '.join(s.zones)}")
        for spot_type in s.spot_instance_types:  # a Spot group's other types
            yield _spot_alternative(spot_type, s.zones, _offered_zones(ec2, spot_type))


def _spot_alternative(instance_type: str, zones: tuple[str, ...], offered: set[str]) -> Result:
    """A Spot alternative missing from a zone is a warning: the group launches its other types there.

    Source: the Amazon EC2 Auto Scaling API reference, MixedInstancesPolicy and LaunchTemplateOverrides
    (docs.amazonaws.cn/autoscaling/ec2/APIReference/API_MixedInstancesPolicy.html): the overrides are the types the
    group may launch to fulfil its capacity; that it skips a type a zone does not offer rather than failing the zone
    is the user guide's account of multiple instance types, not verified here (README: open, a real deploy)."""
    name = f"{instance_type} (Spot alternative) in zones"
    missing = sorted(set(zones) - offered)
    if not missing:
        return Result(name, Status.OK, f"offered in {', '.join(zones)}")
    return Result(
        name,
        Status.WARN,
        f"not offered in {', '.join(missing)} (offered: {', '.join(sorted(offered)) or 'none'}): Spot there draws on "
        "the group's other types only",
        "drop it from the profile's fleet.spot_instance_types, or pin zones that offer it",
    )


def vcpu_quotas(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    quotas = client("service-quotas")
    need: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    stacks: dict[str, list[str]] = defaultdict(list)
    for s in plan.stacks:  # stacks that draw on the same quota add up; a Spot group draws on two
        for code, vcpus_by_phase in ((s.quota_code, s.vcpus), (s.spot_quota_code, s.spot_vcpus)):
            if code and any(vcpus_by_phase.values()):
                for phase, vcpus in vcpus_by_phase.items():
                    need[code][phase] += vcpus
                stacks[code].append(s.stack_name)
    for code, phases in sorted(need.items()):
        quota = quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]
        value, title = int(quota["Value"]), f"vCPU quota {quota.get('QuotaName', code)}"
        detail = (
            f"{value} vCPUs; {'+'.join(stacks[code])} need {phases['create']} at create, {phases['update']} "
            f"during a rolling update, {phases['scale_out']} at full scale-out"
        )
        todo = f"request {code} >= {{}} in Service Quotas ({plan.region})"
        if value < phases["update"]:
            yield Result(title, Status.BLOCKER, detail, todo.format(phases["update"]))
        elif value < phases["scale_out"]:
            yield Result(title, Status.WARN, detail, todo.format(phases["scale_out"]) + " to scale out fully")
        else:
            yield Result(title, Status.OK, detail)


def build_environments(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    images = {(s.stack_name, *b) for s in plan.planned() for b in s.build_images}
    if not images:
        return
    codebuild = client("codebuild")
    curated = {
        image["name"]
        for platform in codebuild.list_curated_environment_images()["platforms"]
        for language in platform.get("languages", [])
        for image in language.get("images", [])
    }
    for stack, env_type, image, compute in sorted(images):
        name = f"CodeBuild {env_type} {stack}"
        if image in curated:
            yield Result(name, Status.OK, f"{image} is offered ({compute})")
        else:
            # A warning: ListCuratedEnvironmentImages can lag the images a region runs (an image missing from the
            # listing may still build); StartBuild refuses an image the region lacks in the first seconds of the deploy.
            yield Result(
                name,
                Status.WARN,
                f"{image} is not in this region's curated image listing",
                "check the CodeBuild console's images for the region; if it is missing, choose another builder "
                "(docker/README.md)",
            )
    concurrency = [
        q
        for page in client("service-quotas").get_paginator("list_service_quotas").paginate(ServiceCode="codebuild")
        for q in page["Quotas"]
        if "concurrently running builds" in q["QuotaName"].lower()
    ]
    for env_type, compute in sorted({(e, c) for _, e, _, c in images}):
        # Quota names read "Concurrently running builds for Linux/Large environment" (ARM/..., Linux GPU/...).
        label = f"{'ARM' if 'ARM' in env_type else 'Linux'}/{_SIZES.get(compute, compute)} environment".lower()
        match = [q for q in concurrency if q["QuotaName"].lower().endswith(label)]
        name = f"CodeBuild concurrency {env_type} {compute}"
        if not match:
            yield Result(name, Status.WARN, "no matching quota listed", "check CodeBuild quotas in the console")
        elif (value := int(match[0]["Value"])) < 1:
            yield Result(
                name,
                Status.BLOCKER,
                f"{match[0]['QuotaName']} = {value}: no build can run",
                f"request {match[0]['QuotaCode']} >= 1 in Service Quotas",
            )
        else:
            yield Result(name, Status.OK, f"{match[0]['QuotaName']} = {value}")


def bootstrap(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    if not plan.planned():
        return
    required = max(s.bootstrap_version for s in plan.planned())
    todo = f"npx cdk bootstrap aws://<account>/{plan.region}"
    try:
        (stack,) = client("cloudformation").describe_stacks(StackName=BOOTSTRAP_STACK)["Stacks"]
    except ClientError as e:
        if "does not exist" not in str(e):
            raise
        yield Result("CDK bootstrap", Status.BLOCKER, f"no {BOOTSTRAP_STACK} stack in {plan.region}", todo)
        return
    if not stack["StackStatus"].endswith("_COMPLETE") or "ROLLBACK" in stack["StackStatus"]:
        yield Result("CDK bootstrap", Status.BLOCKER, f"{BOOTSTRAP_STACK} is {stack['StackStatus']}", todo)
        return
    version = int(client("ssm").get_parameter(Name=BOOTSTRAP_VERSION_PARAMETER)["Parameter"]["Value"])
    if version < required:
        yield Result("CDK bootstrap", Status.BLOCKER, f"version {version}, the templates need {required}", todo)
    else:
        yield Result("CDK bootstrap", Status.OK, f"{BOOTSTRAP_STACK} version {version} (>= {required})")


def lambda_capacity(plan: DeployPlan, client: Clients) -> Iterator[Result]:
    """The stacks' functions (the image build's trigger at deploy time; with wakeOnRequest, the wake door at every
    request while the group sleeps) run in the account's unreserved concurrency (GetAccountSettings)."""
    functions = [f for s in plan.planned() for f in s.functions]
    if not functions:
        return
    limit = client("lambda").get_account_settings()["AccountLimit"]
    unreserved, total = limit["UnreservedConcurrentExecutions"], limit["ConcurrentExecutions"]
    doors = [f for f in functions if f.startswith("WakeDoor")]
    detail = f"{unreserved} of {total} concurrent executions unreserved; {len(functions)} functions"
    detail += f", {len(doors)} wake door(s)" if doors else ""
    if unreserved < 1:
        yield Result(
            "Lambda concurrency",
            Status.BLOCKER,
            detail,
            "release reserved concurrency of other functions or ask for a higher concurrent executions quota",
        )
    else:
        yield Result("Lambda concurrency", Status.OK, detail)
