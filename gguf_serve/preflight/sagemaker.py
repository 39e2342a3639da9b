"""The read-only checks of what a SageMaker stack asks of the account (`gguf-serve-preflight <Name>SageMakerStack`).

The plan (gguf_serve.preflight.plan.EndpointPlan) says what; here:

- The ml type's endpoint-usage quota (Service Quotas, service code `sagemaker`, quota "<ml type> for endpoint
  usage"), applied or default: a region that does not offer the type lists no such quota. An update replaces the
  instances blue/green, new beside old ("Deployment guardrails", https://docs.amazonaws.cn/en_us/sagemaker/latest/dg/deployment-guardrails.html),
  so an update needs twice the running count.
- Application Auto Scaling's service-linked role for SageMaker endpoints (IAM GetRole).
- The ml type's on-demand price in the region (AWS Pricing API, service code AmazonSageMaker), beside the
  catalog's estimate.
What no read-only call tells, each reported as such (never as a pass): whether the region offers the GPU variant's
InferenceAmiVersion, and in which zones SageMaker places the ml type.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from gguf_serve.preflight.checks import Clients, Result, Status
from gguf_serve.preflight.plan import EndpointPlan

SERVICE_LINKED_ROLE = "AWSServiceRoleForApplicationAutoScaling_SageMakerEndpoint"  # stacks/sagemaker/scaling.py


def endpoint_checks(endpoints: tuple[EndpointPlan, ...], region: str, client: Clients) -> list[Result]:
    results: list[Result] = []
    for check in (endpoint_quotas, scaling_role, prices, unreadable):
        try:
            results.extend(check(endpoints, region, client))
        except (ClientError, BotoCoreError) as e:
            results.append(Result(check.__name__, Status.WARN, f"could not check: {e}", "grant read-only access"))
    return results


def endpoint_quotas(endpoints: tuple[EndpointPlan, ...], region: str, client: Clients) -> Iterator[Result]:
    """The ml type's endpoint-usage quota: the applied value (ListServiceQuotas), else the default
    (ListAWSDefaultServiceQuotas): "ListServiceQuotas ... lists the applied quota values ... For some quotas, only
    the default values are available" (Service Quotas API Reference, ListServiceQuotas; docs.amazonaws.cn). A type
    neither lists is one the region does not host; one the region's pinned list lacks but the account has a quota
    for can deploy with -c sagemakerUnlistedTypes=true."""
    if not endpoints:
        return
    quotas = client("service-quotas")
    applied = _quotas(quotas, "list_service_quotas")
    defaults = {} if all(f"{e.ml_type} for endpoint usage" in applied for e in endpoints) else _quotas(
        quotas, "list_aws_default_service_quotas"
    )  # fmt: skip
    for e in endpoints:
        title = f"endpoint quota {e.ml_type}"
        key = f"{e.ml_type} for endpoint usage"
        quota = applied.get(key) or defaults.get(key)
        if quota is None:
            yield Result(
                title,
                Status.BLOCKER,
                f"no '{key}' quota in {region}, applied or default: the region does not host this type",
                "deploy the EC2 stack or an endpoint profile of a type the region hosts (profiles/sagemaker/), "
                "or pick a region that hosts it (-c region=...)",
            )
            continue
        value = int(quota["Value"])
        source = "applied" if key in applied else "default"
        need = f"{e.stack_name} runs {e.min_instances}, {2 * e.min_instances} during an update, up to {e.max_instances}"
        todo = f"request {quota['QuotaCode']} >= {{}} in Service Quotas ({region})"
        unlisted = (
            f"; {region}'s pinned hosting list lacks {e.ml_type}, this account hosts it: deploy with "
            "-c sagemakerUnlistedTypes=true"
            if e.hosted is False and value >= 1
            else ""
        )
        if value < 2 * e.min_instances:
            yield Result(title, Status.BLOCKER, f"{value} ({source}); {need}", todo.format(2 * e.min_instances))
        elif value < e.max_instances:
            yield Result(title, Status.WARN, f"{value} ({source}); {need}{unlisted}",
                         todo.format(e.max_instances) + " to scale out fully")  # fmt: skip
        else:
            yield Result(title, Status.WARN if unlisted else Status.OK, f"{value} ({source}); {need}{unlisted}")


def _quotas(quotas: Any, operation: str) -> dict[str, dict[str, Any]]:
    return {
        q["QuotaName"].lower(): q
        for page in quotas.get_paginator(operation).paginate(ServiceCode="sagemaker")
        for q in page["Quotas"]
    }


def scaling_role(endpoints: tuple[EndpointPlan, ...], region: str, client: Clients) -> Iterator[Result]:
    if not endpoints:
        return
    try:
        client("iam").get_role(RoleName=SERVICE_LINKED_ROLE)
    except ClientError as e:
        if e.response["Error"]["Code"] != "NoSuchEntity":
            raise
        yield Result(
            "auto scaling role",
            Status.WARN,
            f"{SERVICE_LINKED_ROLE} does not exist yet",
            "the deploy creates it if the deploying role may iam:CreateServiceLinkedRole; otherwise create it once",
        )
        return
    yield Result("auto scaling role", Status.OK, f"{SERVICE_LINKED_ROLE} exists")


def prices(endpoints: tuple[EndpointPlan, ...], region: str, client: Clients) -> Iterator[Result]:
    for e in endpoints:
        title = f"price {e.ml_type}"
        found = _on_demand_cny(client("pricing"), e.ml_type, region)
        catalog = f"the catalog's {'estimate' if e.price_is_estimate else 'price'} is ¥{e.price_cny_per_hour:.2f}/h"
        if found is None:
            todo = "check SageMaker's price page for China; profiles/sagemaker.toml holds the number"
            yield Result(title, Status.WARN, f"no hosting price listed for {region}; {catalog}", todo)
        elif e.price_is_estimate:
            todo = f"set on_demand_cny_per_hour = {found:.2f}, price_is_estimate = false (profiles/sagemaker.toml)"
            yield Result(title, Status.WARN, f"¥{found:.2f}/h on demand; {catalog}", todo)
        else:
            yield Result(title, Status.OK, f"¥{found:.2f}/h on demand; {catalog}")


def _on_demand_cny(pricing: Any, ml_type: str, region: str) -> float | None:
    """The hosting on-demand price per hour in CNY from the Pricing API, or None when it lists none."""
    filters = [
        {"Type": "TERM_MATCH", "Field": "instanceName", "Value": ml_type},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
        {"Type": "TERM_MATCH", "Field": "component", "Value": "Hosting"},
    ]
    for item in pricing.get_products(ServiceCode="AmazonSageMaker", Filters=filters, MaxResults=10)["PriceList"]:
        doc = json.loads(item) if isinstance(item, str) else item
        for term in doc.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                price = dimension.get("pricePerUnit", {}).get("CNY")
                if price is not None and dimension.get("unit", "").lower().startswith("hr"):
                    return float(price)
    return None


def unreadable(endpoints: tuple[EndpointPlan, ...], region: str, client: Clients) -> Iterator[Result]:
    for e in endpoints:
        if e.inference_ami:
            yield Result(
                f"inference AMI {e.stack_name}",
                Status.WARN,
                f"no read-only API lists which InferenceAmiVersion {region} offers ({e.inference_ami})",
                "the endpoint fails at create if it is not offered; docs/sagemaker.md says what to try",
            )
