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

NAMES = ["GravitonMoeSageMakerStack", "GpuMtpSageMakerStack"]


@pytest.fixture(scope="module")
def plan():
    return deploy_plan(NAMES, context=cdk_context())


class EndpointAccount(Account):
    """An account ready for the SageMaker stacks; tests change one thing at a time."""

    def __init__(self, plan) -> None:  # Account's fields, from the endpoints (the plan names no EC2 stack)
        self.plan = plan
        self.ami, self.missing_parameters, self.offered_zones, self.quotas = {}, set(), {}, {}
        self.build_concurrency, self.bootstrap_status, self.lambda_unreserved = 1.0, "UPDATE_COMPLETE", 1000
        e = plan.endpoints
        self.curated = {image for s in e for _, image, _ in s.build_images}
        self.bootstrap_version = max(s.bootstrap_version for s in e)
        self.endpoint_services = {n: set(zones) for s in e for n, zones in s.endpoint_services}
        self.endpoint_quota = {s.ml_type: 2.0 * s.max_instances for s in e}
        self.role_exists = True
        self.price = 2.11

    def run(self):
        made = self.clients()
        for service in ("iam", "pricing"):
            made[service] = boto3.client(
                service, region_name=REGION, aws_access_key_id="AKIDEXAMPLE", aws_secret_access_key="x"
            )
            self.stubs[service] = Stubber(made[service])
        quotas = [
            {"QuotaCode": f"L-SM{i}", "QuotaName": f"{t} for endpoint usage", "Value": v, "ServiceCode": "sagemaker"}
            for i, (t, v) in enumerate(sorted(self.endpoint_quota.items()))
        ]
        self.stubs["service-quotas"].add_response(
            "list_service_quotas", {"Quotas": quotas}, {"ServiceCode": "sagemaker"}
        )
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


def test_the_plan_holds_the_endpoints_and_what_they_build(plan):
    assert plan.stacks == () and {e.stack_name for e in plan.endpoints} == set(NAMES)
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
