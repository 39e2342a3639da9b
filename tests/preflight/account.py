"""A China account for the pre-flight: botocore's Stubber on real boto3 clients, so each call is validated against
the service's API model (parameter names and types, response shapes), and each answer is one the service documents.
Everything the stacks need is there; a test breaks one thing at a time."""

from __future__ import annotations

from collections import Counter
from typing import Any

import boto3
from botocore.stub import Stubber

from gguf_serve.preflight.checks import BOOTSTRAP_VERSION_PARAMETER, run_checks
from gguf_serve.preflight.network import ELASTIC_IPS, INTERNET_GATEWAYS, NAT_GATEWAYS_PER_ZONE, VPCS
from gguf_serve.preflight.plan import G_AND_VT_ON_DEMAND, STANDARD_ON_DEMAND, DeployPlan

REGION = "cn-northwest-1"
SERVICES = ("sts", "ssm", "ec2", "service-quotas", "codebuild", "cloudformation", "lambda", "iam")


def make_clients() -> dict[str, Any]:
    return {
        service: boto3.client(service, region_name=REGION, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x")
        for service in SERVICES
    }


class Account:
    def __init__(self, plan: DeployPlan) -> None:
        self.plan = plan
        # Each AMI's root snapshot 40 GiB under the planned volume: what the catalog expects.
        self.ami = {
            s.ami_parameter: (f"ami-{i:017x}", s.architecture, s.root_volume_gib - 40)
            for i, s in enumerate(plan.stacks)
        }
        self.missing_parameters: set[str] = set()
        self.offered_zones = {s.instance_type: set(s.zones) | {"cn-northwest-1c"} for s in plan.stacks}
        # Enough for every stack at full scale-out, summed per quota (the README's quota table)
        self.quotas = {STANDARD_ON_DEMAND: 512.0, G_AND_VT_ON_DEMAND: 64.0}
        planned = plan.planned()  # EC2, SageMaker and EKS stacks alike from here
        self.curated = {image for s in planned for _, image, _ in s.build_images}
        self.build_concurrency = 1.0
        self.bootstrap_status: str | None = "UPDATE_COMPLETE"
        self.bootstrap_version = max(s.bootstrap_version for s in planned)
        zones = {z for s in planned for _, zs in s.endpoint_services for z in zs}
        zones |= {"cn-northwest-1a", "cn-northwest-1c"}
        self.endpoint_services = {n: set(zones) for s in planned for n, _ in s.endpoint_services}
        self.endpoint_services["com.amazonaws.x.other"] = {"cn-northwest-1a"}
        # The network quotas at their defaults (5 each) with the default VPC and its internet gateway in use.
        self.network_quotas = {q.code: 5.0 for q in (VPCS, INTERNET_GATEWAYS, NAT_GATEWAYS_PER_ZONE, ELASTIC_IPS)}
        self.unknown_quota_codes: set[str] = set()  # neither an applied nor a default value
        self.deployed: dict[str, str] = {}  # stack name -> status
        self.vpcs, self.internet_gateways, self.elastic_ips = 1, 1, 0
        self.nat_gateways: dict[str, int] = {}  # zone -> NAT gateways in use
        self.lambda_unreserved = 1000

    def clients(self) -> dict[str, Any]:
        made = make_clients()
        stub = {name: Stubber(c) for name, c in made.items()}
        stub["sts"].add_response(
            "get_caller_identity",
            {
                "Account": "111122223333",
                "Arn": "arn:aws-cn:iam::111122223333:user/reader",
                "UserId": "AIDAEXAMPLEREADER",
            },
        )
        self._amis(stub)
        for s in self.plan.stacks:
            for t in (s.instance_type, *s.spot_instance_types):  # the main type, then a Spot group's others
                zones = self.offered_zones.get(t, set(s.zones))
                where = [{"LocationType": "availability-zone", "Location": z} for z in sorted(zones)]
                offers = [{"InstanceType": t, **w} for w in where]
                stub["ec2"].add_response("describe_instance_type_offerings", {"InstanceTypeOfferings": offers})
        codes = {c for s in self.plan.stacks for c, v in ((s.quota_code, s.vcpus), (s.spot_quota_code, s.spot_vcpus))
                 if c and any(v.values())}  # fmt: skip
        for code in sorted(codes):
            stub["service-quotas"].add_response(
                "get_service_quota",
                {"Quota": {"QuotaCode": code, "QuotaName": f"Running On-Demand {code}", "Value": self.quotas[code]}},
                {"ServiceCode": "ec2", "QuotaCode": code},
            )
        self._codebuild(stub)
        self._bootstrap(stub)
        services = sorted(self.endpoint_services.items())
        details = [{"ServiceName": n, "AvailabilityZones": sorted(z)} for n, z in services]
        stub["ec2"].add_response(
            "describe_vpc_endpoint_services",
            {"ServiceNames": sorted(self.endpoint_services), "ServiceDetails": details},
        )
        self._network(stub)
        stub["lambda"].add_response(
            "get_account_settings",
            {"AccountLimit": {"ConcurrentExecutions": 1000, "UnreservedConcurrentExecutions": self.lambda_unreserved}},
        )
        for s in stub.values():
            s.activate()
        self.stubs = stub
        return made

    def check(self):
        made = self.clients()
        results = run_checks(self.plan, lambda service: made[service])
        for name, s in self.stubs.items():
            if name != "sts":
                s.assert_no_pending_responses()
        return results

    def _amis(self, stub) -> None:
        for s in self.plan.stacks:
            if s.ami_parameter in self.missing_parameters:
                stub["ssm"].add_client_error("get_parameter", "ParameterNotFound",
                                             expected_params={"Name": s.ami_parameter})  # fmt: skip
                continue
            image_id, arch, size = self.ami[s.ami_parameter]
            stub["ssm"].add_response("get_parameter", {"Parameter": {"Name": s.ami_parameter, "Value": image_id}},
                                     {"Name": s.ami_parameter})  # fmt: skip
            stub["ec2"].add_response(
                "describe_images",
                {"Images": [{"ImageId": image_id, "Architecture": arch, "RootDeviceName": "/dev/xvda",
                             "BlockDeviceMappings": [{"DeviceName": "/dev/xvda", "Ebs": {"VolumeSize": size}}]}]},
                {"ImageIds": [image_id]},
            )  # fmt: skip

    def _codebuild(self, stub) -> None:
        if not (self.curated or any(s.build_images for s in self.plan.planned())):
            return
        images = [{"name": n, "description": "", "versions": []} for n in sorted(self.curated)]
        platforms = [{"platform": "AMAZON_LINUX_2023", "languages": [{"language": "STANDARD", "images": images}]}]
        stub["codebuild"].add_response("list_curated_environment_images", {"platforms": platforms})
        quotas = [
            {"QuotaCode": f"L-{kind}{size}", "Value": self.build_concurrency, "ServiceCode": "codebuild",
             "QuotaName": f"Concurrently running builds for {kind}/{size} environment"}
            for kind in ("Linux", "ARM") for size in ("Small", "Medium", "Large", "XLarge", "2XLarge")
        ]  # fmt: skip
        stub["service-quotas"].add_response("list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "codebuild"})

    def _bootstrap(self, stub) -> None:
        if self.bootstrap_status is None:
            stub["cloudformation"].add_client_error(
                "describe_stacks", "ValidationError", "Stack with id CDKToolkit does not exist"
            )
            return
        stub["cloudformation"].add_response(
            "describe_stacks",
            {"Stacks": [{"StackName": "CDKToolkit", "StackStatus": self.bootstrap_status,
                         "CreationTime": "2026-01-01T00:00:00Z"}]},
            {"StackName": "CDKToolkit"},
        )  # fmt: skip
        if self.bootstrap_status.endswith("_COMPLETE") and "ROLLBACK" not in self.bootstrap_status:
            stub["ssm"].add_response(
                "get_parameter",
                {"Parameter": {"Name": BOOTSTRAP_VERSION_PARAMETER, "Value": str(self.bootstrap_version)}},
                {"Name": BOOTSTRAP_VERSION_PARAMETER},
            )

    def _network(self, stub) -> None:
        """What network_quotas asks, in its order: each stack's status, then per quota its value and the use."""
        new = []
        for s in self.plan.planned():
            status = self.deployed.get(s.stack_name)
            if status is None:
                stub["cloudformation"].add_client_error(
                    "describe_stacks", "ValidationError", f"Stack with id {s.stack_name} does not exist",
                    expected_params={"StackName": s.stack_name},
                )  # fmt: skip
            else:
                stub["cloudformation"].add_response(
                    "describe_stacks",
                    {"Stacks": [{"StackName": s.stack_name, "StackStatus": status,
                                 "CreationTime": "2026-01-01T00:00:00Z"}]},
                    {"StackName": s.stack_name},
                )  # fmt: skip
            if status in (None, "ROLLBACK_COMPLETE"):
                new.append(s)
        if not new:
            return
        need = {q: sum(getattr(s.network, f) for s in new) for q, f in
                ((VPCS, "vpcs"), (INTERNET_GATEWAYS, "internet_gateways"), (ELASTIC_IPS, "elastic_ips"))}  # fmt: skip
        if need[VPCS]:
            self._quota(stub, VPCS)
            stub["ec2"].add_response("describe_vpcs", {"Vpcs": [{"VpcId": f"vpc-{i:08x}"} for i in range(self.vpcs)]})
        if need[INTERNET_GATEWAYS]:
            self._quota(stub, INTERNET_GATEWAYS)
            gateways = [{"InternetGatewayId": f"igw-{i:08x}"} for i in range(self.internet_gateways)]
            stub["ec2"].add_response("describe_internet_gateways", {"InternetGateways": gateways})
        if need[ELASTIC_IPS]:
            self._quota(stub, ELASTIC_IPS)
            addresses = [{"AllocationId": f"eipalloc-{i:08x}", "Domain": "vpc"} for i in range(self.elastic_ips)]
            stub["ec2"].add_response("describe_addresses", {"Addresses": addresses})
        if not any(s.network.nat_gateways for s in new):
            return
        self._quota(stub, NAT_GATEWAYS_PER_ZONE)
        in_use = [(z, i) for z, n in sorted(self.nat_gateways.items()) for i in range(n)]
        gateways = [{"NatGatewayId": f"nat-{i:08x}{z[-1]}", "SubnetId": f"subnet-{z[-1]}"} for z, i in in_use]
        stub["ec2"].add_response(
            "describe_nat_gateways",
            {"NatGateways": gateways},
            {"Filters": [{"Name": "state", "Values": ["pending", "available", "deleting"]}]},
        )
        if gateways:
            subnets = sorted({g["SubnetId"] for g in gateways})
            zones = {f"subnet-{z[-1]}": z for z in self.nat_gateways}
            stub["ec2"].add_response(
                "describe_subnets",
                {"Subnets": [{"SubnetId": s, "AvailabilityZone": zones[s]} for s in subnets]},
                {"SubnetIds": subnets},
            )

    def _quota(self, stub, quota) -> None:
        params = {"ServiceCode": quota.service, "QuotaCode": quota.code}
        if quota.code in self.unknown_quota_codes:
            stub["service-quotas"].add_client_error("get_service_quota", "NoSuchResourceException",
                                                    expected_params=params)  # fmt: skip
            stub["service-quotas"].add_client_error("get_aws_default_service_quota", "NoSuchResourceException",
                                                    expected_params=params)  # fmt: skip
            return
        answer = {"Quota": {**params, "QuotaName": quota.name, "Value": self.network_quotas[quota.code]}}
        stub["service-quotas"].add_response("get_service_quota", answer, params)


class Session:
    """What the CLI takes as a boto3 session: the stubbed clients, each for the plan's region."""

    def __init__(self, made: dict[str, Any]) -> None:
        self.made = made

    def client(self, service: str, region_name: str):
        assert region_name == REGION
        return self.made[service]


def network_need(plan: DeployPlan) -> Counter:
    """What the plan's stacks add together: VPCs, internet gateways, Elastic IPs and NAT gateways per zone."""
    need: Counter = Counter()
    for s in plan.stacks:
        need.update(vpcs=s.network.vpcs, igws=s.network.internet_gateways, eips=s.network.elastic_ips)
        need.update({f"nat:{z}": n for z, n in s.network.nat_gateways})
    return need
