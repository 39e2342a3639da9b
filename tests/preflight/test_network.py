"""The network quotas (VPCs, internet gateways, Elastic IPs, NAT gateways per zone: what each stack's template
creates, added up over the stacks not yet deployed, plus what the region already uses) and each endpoint service
in each pinned zone, against the stubbed account (tests/preflight/account.py)."""

from __future__ import annotations

from gguf_serve.preflight.checks import Status
from gguf_serve.preflight.network import ELASTIC_IPS, NAT_GATEWAYS_PER_ZONE, VPCS
from tests.committed import profile_by_stack
from tests.preflight.account import Account, network_need


def _named(results, starts: str, status: Status):
    found = [r for r in results if r.check.startswith(starts) and r.status is status]
    assert found, [(r.check, r.status.value, r.detail) for r in results if r.status is not Status.OK]
    return found


def test_each_stack_plans_the_vpc_gateways_and_addresses_its_template_creates(plan):
    for s in plan.stacks:
        nat = profile_by_stack(s.stack_name).fleet.network.nat_gateways
        assert (s.network.vpcs, s.network.internet_gateways, s.network.elastic_ips) == (1, 1, nat)
        assert s.network.nat_gateways == ((s.zones[0], nat),)  # ec2.Vpc places them in the first zones
        interface = [zones for _, zones in s.endpoint_services if zones]
        assert interface and all(zones == s.zones for zones in interface)  # a network interface in each pinned zone
        assert any(not zones for _, zones in s.endpoint_services)  # the S3 gateway endpoint has no subnets


def test_the_default_quotas_hold_every_stack_beside_the_default_vpc(plan):
    need = network_need(plan)
    assert need["vpcs"] == len(plan.stacks) == 4  # 4 + the default VPC = 5, the default quota
    results = Account(plan).check()
    ok = {r.check: r.detail for r in results if r.status is Status.OK}
    assert ok[VPCS.name] == f"5 allowed, 1 in use; {'+'.join(s.stack_name for s in plan.stacks)} add 4"
    assert f"{NAT_GATEWAYS_PER_ZONE.name} (cn-northwest-1a)" in ok


def test_one_vpc_too_many_is_a_blocker_that_names_the_quota_and_the_number(plan):
    account = Account(plan)
    account.vpcs = 2
    (r,) = _named(account.check(), VPCS.name, Status.BLOCKER)
    assert r.detail.startswith("5 allowed, 2 in use;") and r.detail.endswith("add 4")
    assert r.todo.startswith(f"request {VPCS.code} >= 6 in Service Quotas (cn-northwest-1)")


def test_deployed_stacks_hold_their_vpcs_already_and_a_rolled_back_one_does_not(plan):
    account = Account(plan)
    names = [s.stack_name for s in plan.stacks]
    account.deployed = {names[0]: "UPDATE_COMPLETE", names[1]: "CREATE_COMPLETE", names[2]: "ROLLBACK_COMPLETE"}
    account.vpcs = 3  # the default VPC and the two deployed stacks'
    ok = {r.check: r.detail for r in account.check() if r.status is Status.OK}
    assert ok[VPCS.name] == f"5 allowed, 3 in use; {names[2]}+{names[3]} add 2"
    account = Account(plan)
    account.deployed = dict.fromkeys(names, "UPDATE_COMPLETE")
    results = account.check()  # no quota is read: the stubs would refuse a call they do not expect
    (r,) = [r for r in results if r.check == "network quotas"]
    assert r.status is Status.OK and "every selected stack is deployed" in r.detail


def test_nat_gateways_count_per_zone(plan):
    account = Account(plan)
    account.nat_gateways = {"cn-northwest-1a": 2, "cn-northwest-1b": 5}  # 1b is full, but no stack adds one there
    (r,) = _named(account.check(), f"{NAT_GATEWAYS_PER_ZONE.name} (cn-northwest-1a)", Status.BLOCKER)
    assert r.detail.startswith("5 allowed, 2 in use;") and f"{NAT_GATEWAYS_PER_ZONE.code} >= 6" in r.todo
    account = Account(plan)
    account.nat_gateways = {"cn-northwest-1a": 1, "cn-northwest-1b": 5}
    results = account.check()
    assert not [r for r in results if r.check.startswith(NAT_GATEWAYS_PER_ZONE.name) and r.status is not Status.OK]


def test_elastic_ips_in_use_leave_too_few_for_the_nat_gateways(plan):
    account = Account(plan)
    account.elastic_ips = 2
    (r,) = _named(account.check(), ELASTIC_IPS.name, Status.BLOCKER)
    assert r.detail.startswith("5 allowed, 2 in use;") and f"{ELASTIC_IPS.code} >= 6" in r.todo


def test_a_quota_code_the_region_does_not_know_is_a_warning_not_a_pass(plan):
    account = Account(plan)
    account.unknown_quota_codes = {ELASTIC_IPS.code}
    account.elastic_ips = 50  # would be a blocker if the value were guessed
    (r,) = _named(account.check(), ELASTIC_IPS.name, Status.WARN)
    assert f"could not read ec2 quota {ELASTIC_IPS.code}" in r.detail and "Service Quotas console" in r.todo


def test_missing_endpoint_service(plan):
    account = Account(plan)
    gone = next(n for n in sorted(account.endpoint_services) if "ecr.dkr" in n)
    del account.endpoint_services[gone]
    (r,) = _named(account.check(), "VPC endpoint services", Status.BLOCKER)
    assert gone in r.detail


def test_an_endpoint_service_missing_in_a_pinned_zone_names_the_zone(plan):
    account = Account(plan)
    ssm = next(n for n in account.endpoint_services if n.endswith(".ssm"))
    account.endpoint_services[ssm] = {"cn-northwest-1a", "cn-northwest-1c"}
    results = account.check()
    (r,) = _named(results, f"VPC endpoint {ssm}", Status.BLOCKER)
    assert r.detail == "not offered in cn-northwest-1b (offered in: cn-northwest-1a, cn-northwest-1c)"
    assert "pinned-availability-zones" in r.todo
    assert not [r for r in results if r.check == "VPC endpoint services"]  # no "all offered" beside it


def test_behind_a_shared_endpoint_the_stacks_add_one_vpc_the_shared_stacks():
    """sharedEndpoint: the pre-flight plans SharedEndpointStack (its VPC, gateways and endpoint services) whichever
    stacks behind it are named, and those stacks no VPC of their own."""
    from gguf_serve.preflight.plan import deploy_plan
    from stacks.shared_endpoint import STACK_NAME
    from tests.conftest import cdk_context
    from tests.stacks.shared.conftest import CONTEXT

    plan = deploy_plan(["GpuMtpStack", "IntelMoeStack"], context={**cdk_context(), **CONTEXT})
    assert [s.stack_name for s in plan.shared] == [STACK_NAME]
    (shared,) = plan.shared
    assert (shared.network.vpcs, shared.network.internet_gateways) == (1, 1)
    assert any(zones for _, zones in shared.endpoint_services)  # the interface endpoints are the shared VPC's
    for s in plan.stacks:
        assert s.network.vpcs == s.network.internet_gateways == s.network.elastic_ips == 0, s.stack_name
    assert sum(s.network.vpcs for s in plan.planned()) == 1
    ok = {r.check: r.detail for r in Account(plan).check() if r.status is Status.OK}
    assert ok[VPCS.name].endswith(f"{'+'.join(s.stack_name for s in plan.planned() if s.network.vpcs)} add 1")
