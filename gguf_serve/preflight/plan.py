"""What the deploy will ask of the account, read from the same app `cdk synth` builds (no AWS calls here)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_serve.catalog.hosting import sagemaker_stack_name
from gguf_serve.catalog.loader import PROFILES_DIR
from gguf_serve.catalog.lookup import stack_models
from stacks.app import build_app, cli_context, plan_app
from stacks.eks.stack import STACK_NAME as EKS_STACK
from stacks.options import DEPLOY_CONFIG
from stacks.plan import ServicePlan
from stacks.sagemaker.stack import SageMakerStack
from stacks.shared_endpoint import STACK_NAME as SHARED_STACK

# Service Quotas codes for running On-Demand and Spot vCPUs: c8g/c8i are Standard (A, C, D, H, I, M, R, T, Z), g5 is
# G and VT. L-1216C47A is shown by name in the AWS CLI User Guide's Service Quotas examples (docs.amazonaws.cn);
# the others are the EC2 quota list's codes, not verified here: a wrong code answers NoSuchResourceException,
# which the pre-flight reports as "could not check", never as a pass.
STANDARD_ON_DEMAND = "L-1216C47A"
G_AND_VT_ON_DEMAND = "L-DB2E81BA"
STANDARD_SPOT = "L-34B43A08"
G_AND_VT_SPOT = "L-3819A6DF"


@dataclass(frozen=True)
class NetworkPlan:
    """What a stack's VPC adds to the region's network quotas when the stack is created."""

    vpcs: int = 0
    internet_gateways: int = 0
    elastic_ips: int = 0
    nat_gateways: tuple[tuple[str, int], ...] = ()  # (zone, NAT gateways placed in it)


@dataclass(frozen=True)
class StackPlan:
    stack_name: str
    instance_type: str
    architecture: str  # arm64 | x86_64, as DescribeImages reports it
    ami_parameter: str
    root_volume_gib: int  # 0: not planned yet (the model has no lock entry)
    zones: tuple[str, ...]
    vcpus: dict[str, int]  # create / update / scale_out, against quota_code
    quota_code: str
    build_images: tuple[tuple[str, str, str], ...]  # CodeBuild (environment type, image, compute type)
    endpoint_services: tuple[tuple[str, tuple[str, ...]], ...]  # (service name, zones of its subnets; () gateway)
    bootstrap_version: int  # the lowest CDK bootstrap stack version the template accepts
    functions: tuple[str, ...] = ()  # Lambda functions' logical ids (the image build's trigger, WakeDoor...)
    network: NetworkPlan = NetworkPlan()
    # spot=true: Spot above the On-Demand base (Capacity.on_demand_base); quota_code and vcpus are the base's
    spot_vcpus: dict[str, int] = field(default_factory=dict)
    spot_quota_code: str = ""
    spot_instance_types: tuple[str, ...] = ()  # the other types a Spot group launches (fleet.spot_instance_types)


@dataclass(frozen=True)
class EndpointPlan:
    stack_name: str
    ml_type: str
    min_instances: int
    max_instances: int
    inference_ami: str | None
    price_cny_per_hour: float
    price_is_estimate: bool
    build_images: tuple[tuple[str, str, str], ...]  # the image build's and the model staging's CodeBuild
    endpoint_services: tuple[tuple[str, tuple[str, ...]], ...]  # as StackPlan's
    bootstrap_version: int
    functions: tuple[str, ...] = ()
    network: NetworkPlan = NetworkPlan()  # the endpoint's own VPC (isolated subnets, no gateways)
    # the region's pinned hosting list names ml_type; None: no list for the region, or sagemakerUnlistedTypes is set
    hosted: bool | None = None


@dataclass(frozen=True)
class ClusterPlan:
    """What EksServingStack's template asks of the account besides its node groups (gguf_serve/preflight/eks.py):
    the image builds (a CUDA base on XLARGE), the bootstrap, the VPC's endpoints and gateways, the Lambda functions
    (the kubectl handler and the build steps)."""

    stack_name: str
    build_images: tuple[tuple[str, str, str], ...]
    endpoint_services: tuple[tuple[str, tuple[str, ...]], ...]
    bootstrap_version: int
    functions: tuple[str, ...] = ()
    network: NetworkPlan = NetworkPlan()


@dataclass(frozen=True)
class DeployPlan:
    region: str
    stacks: tuple[StackPlan, ...]
    refused: tuple[tuple[str, str], ...] = ()  # (stack, why) the CLI refuses; planned and checked all the same
    endpoints: tuple[EndpointPlan, ...] = ()  # the SageMaker stacks named (gguf_serve/preflight/sagemaker.py)
    debian_mirrors: tuple[str, ...] = ()  # the deploy option debianMirrors, in the order the build probes them
    clusters: tuple[ClusterPlan, ...] = ()  # EksServingStack, when named
    # SharedEndpointStack (sharedEndpoint): the VPC, load balancer and key of the EC2 stacks behind it, which then
    # add no network of their own
    shared: tuple[ClusterPlan, ...] = ()

    def planned(self) -> tuple[StackPlan | EndpointPlan | ClusterPlan, ...]:
        """Every stack of the plan, of the three targets: what each asks of CodeBuild, the bootstrap, the network,
        endpoint services and Lambda is checked alike."""
        return (*self.stacks, *self.endpoints, *self.clusters, *self.shared)


def deploy_plan(
    stack_names: list[str] | None = None, context: dict[str, Any] | None = None, config_file: Path = DEPLOY_CONFIG
) -> DeployPlan:
    """The plan `cdk synth` builds from (model lookups included), every wanted stack in it: one the CLI would refuse
    is planned and synthesized here without its error annotation, so what it needs of the account is checked too,
    and its refusal is reported beside (in-process synthesis would fail the whole app on one annotated stack). The
    instance, volume, zones and vCPUs come from the plan; what only the template says (CodeBuild images, endpoint
    services, bootstrap version, functions) from the synthesized template."""
    ctx = {**cli_context(), **(context or {})}
    stacks = stack_models(PROFILES_DIR)
    endpoint_stacks = list(stack_models(PROFILES_DIR, "sagemaker"))
    # a SageMaker stack (a twin or an endpoint profile's) and the EKS stack are checked when named
    known = [*stacks, *(sagemaker_stack_name(n) for n in stacks), *endpoint_stacks, EKS_STACK, SHARED_STACK]
    unknown = set(stack_names or ()) - set(known)
    if unknown:
        raise SystemExit(f"error: no stack named {sorted(unknown)}; the stacks are {sorted(known)}")
    app_plan = plan_app(ctx, config_file=config_file, stack_names=stack_names or list(stacks))
    app = build_app(ctx, plan=app_plan, annotate_refusals=False)
    assembly = app.synth()
    templates = {s.stack_name: s.template for s in assembly.stacks}
    images: dict[str, tuple[tuple[str, str, str], ...]] = {}  # image target -> its CodeBuild environments
    for name, service in app_plan.services.items():
        if service.profile is not None:
            images[service.image.name] = tuple(_build_images(templates[name]))
    region = app_plan.options.region
    plans = []
    for name, service in app_plan.services.items():
        # On-Demand vCPUs, and the Spot ones of a group on Spot (its On-Demand base is in the first)
        vcpus, spot_vcpus = service.spot_vcpu_plan() if service.spot else (service.vcpu_plan(), {})
        plan = StackPlan(
            stack_name=name,
            instance_type=service.hardware.instance_type,
            architecture=service.hardware.architecture.value,
            ami_parameter=service.hardware.ami_ssm_parameter,
            root_volume_gib=service.root_volume_gib,
            zones=tuple(sorted(service.vpc_zones)),
            vcpus=vcpus,
            quota_code=quota_code(service.hardware.has_gpu, spot=False),
            spot_vcpus=spot_vcpus,
            spot_quota_code=quota_code(service.hardware.has_gpu, spot=True) if service.spot else "",
            spot_instance_types=service.capacity.spot_instance_types if service.spot else (),
            build_images=images.get(service.image.name, ()),  # an unlocked stack: those of its image target
            endpoint_services=tuple(sorted(_endpoint_services(templates[name], region))),
            bootstrap_version=_bootstrap_version(templates[name]),
            functions=tuple(_functions(templates[name])),
            network=_network(templates[name])
            if service.profile is not None
            else NetworkPlan()
            if name in app_plan.options.shared_endpoint  # the shared stack's VPC
            else _unbuilt_network(service),
        )
        plans.append(plan)
    endpoints = [
        _endpoint_plan(
            stack,
            templates[stack.stack_name],
            region,
            None if app_plan.options.sagemaker_unlisted_types else app_plan.hosted.hosts(region, stack.plan.ml_type),
        )  # fmt: skip
        for stack in app.node.children
        if isinstance(stack, SageMakerStack)
    ]
    clusters = [_cluster_plan(templates[EKS_STACK], region)] if EKS_STACK in templates else []
    shared = [_cluster_plan(templates[SHARED_STACK], region, SHARED_STACK)] if SHARED_STACK in templates else []
    return DeployPlan(
        region=region,
        stacks=tuple(plans),
        refused=tuple(sorted(app_plan.refusals.items())),
        endpoints=tuple(endpoints),
        debian_mirrors=app_plan.options.debian_mirrors,
        clusters=tuple(clusters),
        shared=tuple(shared),
    )


def _cluster_plan(template: dict, region: str, stack_name: str = EKS_STACK) -> ClusterPlan:
    return ClusterPlan(
        stack_name=stack_name,
        build_images=tuple(_build_images(template)),
        endpoint_services=tuple(sorted(_endpoint_services(template, region))),
        bootstrap_version=_bootstrap_version(template),
        functions=tuple(_functions(template)),
        network=_network(template),
    )


def _unbuilt_network(service: ServicePlan) -> NetworkPlan:
    """The VPC a stack whose model is not locked yet will create (its template is empty until then): one VPC and
    internet gateway, and its NAT gateways (and their addresses) in the first zones, as ec2.Vpc places them."""
    nat = service.fleet.network.nat_gateways
    return NetworkPlan(1, 1, nat, tuple((z, 1) for z in service.vpc_zones[:nat]))


def _endpoint_plan(stack: SageMakerStack, template: dict, region: str, hosted: bool | None) -> EndpointPlan:
    plan, hosting = stack.plan, stack.hosting
    return EndpointPlan(
        stack_name=stack.stack_name,
        ml_type=plan.ml_type,
        min_instances=plan.min_instances,
        max_instances=plan.max_instances,
        inference_ami=plan.inference_ami,
        price_cny_per_hour=hosting.on_demand_cny_per_hour,
        price_is_estimate=hosting.price_is_estimate,
        build_images=tuple(_build_images(template)),
        endpoint_services=tuple(sorted(_endpoint_services(template, region))),
        bootstrap_version=_bootstrap_version(template),
        functions=tuple(_functions(template)),
        network=_network(template),
        hosted=hosted,
    )


def quota_code(gpu: bool, spot: bool) -> str:
    if spot:
        return G_AND_VT_SPOT if gpu else STANDARD_SPOT
    return G_AND_VT_ON_DEMAND if gpu else STANDARD_ON_DEMAND


def _resources(template: dict, kind: str) -> list[dict]:
    return [r.get("Properties", {}) for r in template["Resources"].values() if r["Type"] == kind]


def _functions(template: dict) -> list[str]:
    return sorted(name for name, r in template["Resources"].items() if r["Type"] == "AWS::Lambda::Function")


def _subnet_zone(template: dict, ref: dict) -> str:
    return template["Resources"][ref["Ref"]]["Properties"]["AvailabilityZone"]


def _network(template: dict) -> NetworkPlan:
    nat = Counter(_subnet_zone(template, p["SubnetId"]) for p in _resources(template, "AWS::EC2::NatGateway"))
    return NetworkPlan(
        vpcs=len(_resources(template, "AWS::EC2::VPC")),
        internet_gateways=len(_resources(template, "AWS::EC2::InternetGateway")),
        elastic_ips=len(_resources(template, "AWS::EC2::EIP")),
        nat_gateways=tuple(sorted(nat.items())),
    )


def _build_images(template: dict) -> list[tuple[str, str, str]]:
    """Each CodeBuild environment a build runs in: a project's own, and each compute type a build step starts it
    with (stacks/image_build.py: a stage's ComputeType, the start handler's computeTypeOverride; a CUDA base's
    XLARGE)."""
    projects = {k: r["Properties"]["Environment"] for k, r in template["Resources"].items()
                if r["Type"] == "AWS::CodeBuild::Project"}  # fmt: skip
    found = {(e["Type"], e["Image"], e["ComputeType"]) for e in projects.values() if isinstance(e.get("Image"), str)}
    for props in _resources(template, "AWS::CloudFormation::CustomResource"):
        project = props.get("ProjectName")
        env = projects.get(project["Ref"]) if isinstance(project, dict) and "Ref" in project else None
        if env is not None and isinstance(env.get("Image"), str) and isinstance(props.get("ComputeType"), str):
            found.add((env["Type"], env["Image"], props["ComputeType"]))
    return sorted(found)


def _endpoint_services(template: dict, region: str) -> set[tuple[str, tuple[str, ...]]]:
    """Each endpoint's service name and the zones of its subnets (an interface endpoint has a network interface in
    each; a gateway endpoint has none)."""
    services = set()
    for props in _resources(template, "AWS::EC2::VPCEndpoint"):
        name = props["ServiceName"]
        if isinstance(name, dict):  # {"Fn::Join": ["", ["com.amazonaws.", {"Ref": "AWS::Region"}, ".s3"]]}
            parts = name["Fn::Join"][1]
            name = "".join(region if p == {"Ref": "AWS::Region"} else p for p in parts)
        zones = sorted({_subnet_zone(template, ref) for ref in props.get("SubnetIds", [])})
        services.add((name, tuple(zones)))
    return services


def _bootstrap_version(template: dict) -> int:
    """The CheckBootstrapVersion rule lists the versions it refuses; one more than the highest is required."""
    for assertion in template.get("Rules", {}).get("CheckBootstrapVersion", {}).get("Assertions", []):
        refused = assertion["Assert"]["Fn::Not"][0]["Fn::Contains"][0]
        return max(int(v) for v in refused) + 1
    return 0
