"""The pre-flight of the SageMaker stacks: what they ask of the account, against stubbed real clients
(botocore's Stubber checks every call and answer against the service's API model, as tests/preflight does)."""

from __future__ import annotations

import json

import boto3
import pytest
from botocore.stub import Stubber

from gguf_serve.preflight.checks import Status, run_checks
from gguf_serve.preflight.plan import deploy_plan
from gguf_serve.preflight.sagemaker import SERVICE_LINKED_ROLE, endpoint_checks
from tests.conftest import cdk_context
from tests.preflight.account import REGION, Account

NAMES = ["GravitonMoeSageMakerStack", "GpuMtpSageMakerStack"]  # twins on types Ningxia's list lacks
HOSTED = ["C5MoeSageMakerStack", "G4dnMoeSageMakerStack"]  # the endpoint profiles on types Ningxia hosts


@pytest.fixture(scope="module")
def plan():
    """The twins with sagemakerUnlistedTypes: deployable, so the account's answers decide."""
    return deploy_plan(NAMES, context={**cdk_context(), "sagemakerUnlistedTypes": "true"})


@pytest.fixture(scope="module")
def refused_plan():
    """The twins as a Ningxia deploy plans them: refused, their types not on the region's list."""
    return deploy_plan(NAMES, context=cdk_context())


@pytest.fixture(scope="module")
def hosted_plan():
    return deploy_plan(HOSTED, context=cdk_context())


class EndpointAccount(Account):
    """An account ready for the SageMaker stacks; tests change one thing at a time."""

    def __init__(self, plan) -> None:  # Account's fields (the plan names no EC2 stack), and the endpoints' own
        super().__init__(plan)
        self.endpoint_quota = {s.ml_type: 2.0 * s.max_instances for s in plan.endpoints}
        self.default_quota: dict[str, float] = {}  # quotas never changed: ListAWSDefaultServiceQuotas only
        self.role_exists = True
        self.price = 2.11

    def run(self):
        made = self.clients()
        for service in ("iam", "pricing"):
            made[service] = boto3.client(
                service, region_name=REGION, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x"
            )
            self.stubs[service] = Stubber(made[service])

        def listing(values: dict[str, float], first: int) -> list[dict]:
            return [
                {"QuotaCode": f"L-SM{first + i}", "QuotaName": f"{t} for endpoint usage", "Value": v,
                 "ServiceCode": "sagemaker"}
                for i, (t, v) in enumerate(sorted(values.items()))
            ]  # fmt: skip

        self.stubs["service-quotas"].add_response(
            "list_service_quotas", {"Quotas": listing(self.endpoint_quota, 0)}, {"ServiceCode": "sagemaker"}
        )
        if any(e.ml_type not in self.endpoint_quota for e in self.plan.endpoints):  # only then the defaults
            self.stubs["service-quotas"].add_response(
                "list_aws_default_service_quotas", {"Quotas": listing(self.default_quota, 50)},
                {"ServiceCode": "sagemaker"},
            )  # fmt: skip
        if self.role_exists:
            role = {"Path": "/aws-service-role/", "RoleName": SERVICE_LINKED_ROLE, "RoleId": "AROAEXAMPLEEXAMPLE1",
                    "Arn": f"arn:aws-cn:iam::111122223333:role/{SERVICE_LINKED_ROLE}",
                    "CreateDate": "2026-01-01T00:00:00Z"}  # fmt: skip
            self.stubs["iam"].add_response("get_role", {"Role": role}, {"RoleName": SERVICE_LINKED_ROLE})
        else:
            self.stubs["iam"].add_client_error(
                "get_role", "NoSuchEntity", expected_params={"RoleName": SERVICE_LINKED_ROLE}
            )
        for _endpoint in self.plan.endpoints:  # one get_products each
            item = {"terms": {"OnDemand": {"t": {"priceDimensions": {"d": {"unit": "Hrs",
                    "pricePerUnit": {"CNY": f"{self.price}"}}}}}}}  # fmt: skip
            listed = [json.dumps(item)] if self.price is not None else []
            self.stubs["pricing"].add_response("get_products", {"PriceList": listed, "FormatVersion": "aws_v1"})
        for name in ("iam", "pricing"):
            self.stubs[name].activate()
        client = lambda service: made[service]  # noqa: E731
        results = run_checks(self.plan, client) + endpoint_checks(self.plan.endpoints, REGION, client)
        for name, s in self.stubs.items():
            if name != "sts":
                s.assert_no_pending_responses()
        return results


def _find(results, starts: str):
    found = [r for r in results if r.check.startswith(starts)]
    assert found, results
    return found


def test_the_plan_holds_the_endpoints_and_what_they_build(plan, hosted_plan):
    assert plan.stacks == () and {e.stack_name for e in plan.endpoints} == set(NAMES)
    (t4,) = [e for e in hosted_plan.endpoints if e.ml_type == "ml.g4dn.2xlarge"]
    assert ("LINUX_CONTAINER", "aws/codebuild/amazonlinux-x86_64-standard:5.0", "BUILD_GENERAL1_XLARGE") in (
        t4.build_images
    )  # the CUDA base's stage, as the start handler overrides it
    by_name = {e.stack_name: e for e in plan.endpoints}
    assert by_name["GravitonMoeSageMakerStack"].ml_type == "ml.c8g.4xlarge"
    assert by_name["GpuMtpSageMakerStack"].inference_ami == "al2-ami-sagemaker-inference-gpu-3-1"
    images = {compute for e in plan.endpoints for _, _, compute in e.build_images}
    assert "BUILD_GENERAL1_MEDIUM" in images  # the model staging's builder, beside the image build's
    assert all(e.bootstrap_version > 0 for e in plan.endpoints)


def test_a_ready_account_passes_all_but_what_cannot_be_read(plan):
    results = EndpointAccount(plan).run()
    assert not [r for r in results if r.status is Status.BLOCKER]
    warned = [r for r in results if r.status is Status.WARN]
    assert sorted(r.check.split()[0] for r in warned) == ["inference", "price", "price"]  # open, and estimates
    assert all(r.status is Status.OK for r in _find(results, "endpoint quota"))
    (price,) = [r for r in warned if "ml.c8g.4xlarge" in r.check]
    assert "¥2.11/h on demand" in price.detail and "on_demand_cny_per_hour = 2.11" in price.todo


def test_a_type_the_region_does_not_host_is_a_blocker(plan):
    account = EndpointAccount(plan)
    del account.endpoint_quota["ml.g5.xlarge"]
    (blocker,) = [r for r in account.run() if r.status is Status.BLOCKER]
    assert blocker.check == "endpoint quota ml.g5.xlarge" and "does not host this type" in blocker.detail
    assert "applied or default" in blocker.detail


def test_a_quota_never_changed_is_read_from_the_defaults_not_called_unhosted(plan):
    account = EndpointAccount(plan)
    account.default_quota["ml.g5.xlarge"] = account.endpoint_quota.pop("ml.g5.xlarge")  # listed by default only
    results = account.run()
    (quota,) = _find(results, "endpoint quota ml.g5.xlarge")
    assert quota.status is Status.OK and "(default)" in quota.detail
    assert not [r for r in results if r.status is Status.BLOCKER]


def test_a_refused_unlisted_type_the_account_hosts_says_which_option_deploys_it(refused_plan):
    assert sorted(name for name, _ in refused_plan.refused) == sorted(NAMES)  # not on Ningxia's list
    results = EndpointAccount(refused_plan).run()
    (quota,) = _find(results, "endpoint quota ml.c8g.4xlarge")
    assert quota.status is Status.WARN and "deploy with -c sagemakerUnlistedTypes=true" in quota.detail
    refused = [r for r in results if r.check.startswith("refused ")]
    assert sorted(r.check for r in refused) == sorted(f"refused {n}" for n in NAMES)


def test_the_stacks_ningxia_hosts_pass_and_their_vpcs_are_counted(hosted_plan):
    assert hosted_plan.refused == () and {e.stack_name for e in hosted_plan.endpoints} == set(HOSTED)
    assert all(e.network.vpcs == 1 and e.network.internet_gateways == 0 for e in hosted_plan.endpoints)
    account = EndpointAccount(hosted_plan)
    results = account.run()
    assert not [r for r in results if r.status is Status.BLOCKER]
    (vpcs,) = _find(results, "VPCs per Region")
    assert "add 2" in vpcs.detail  # one isolated VPC each
    account = EndpointAccount(hosted_plan)
    account.vpcs = 4  # with the default VPC and three others, two more do not fit the default quota of 5
    (vpcs,) = _find(account.run(), "VPCs per Region")
    assert vpcs.status is Status.BLOCKER


def test_a_quota_too_small_for_an_update_blocks_and_below_scale_out_warns(plan):
    account = EndpointAccount(plan)
    account.endpoint_quota["ml.c8g.4xlarge"] = 1.0  # blue/green needs two while one runs
    account.endpoint_quota["ml.g5.xlarge"] = 3.0  # updates fit; four at full scale-out do not
    results = account.run()
    (small,) = _find(results, "endpoint quota ml.c8g.4xlarge")
    assert small.status is Status.BLOCKER and small.todo.startswith("request L-SM0 >= 2")
    (short,) = _find(results, "endpoint quota ml.g5.xlarge")
    assert short.status is Status.WARN and "to scale out fully" in short.todo


def test_a_missing_scaling_role_is_a_warning_with_what_the_deploy_needs(plan):
    account = EndpointAccount(plan)
    account.role_exists = False
    (role,) = _find(account.run(), "auto scaling role")
    assert role.status is Status.WARN and "iam:CreateServiceLinkedRole" in role.todo


def test_no_listed_price_is_reported_not_passed(plan):
    account = EndpointAccount(plan)
    account.price = None
    prices = _find(account.run(), "price")
    assert all(r.status is Status.WARN and "no hosting price listed" in r.detail for r in prices)
