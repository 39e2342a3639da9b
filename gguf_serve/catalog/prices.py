"""EC2 prices from the AWS Price List API, against the pinned table in profiles/hardware.toml.

Read-only: GetProducts only. What the API says, with its sources:
- The China partition's Price List endpoint is api.pricing.cn-northwest-1.amazonaws.com.cn, the only region
  botocore's endpoints.json lists for "api.pricing" in the aws-cn partition; it answers in CNY (docs/findings.md,
  fifth round). It carries no Spot prices (Spot is priced by DescribeSpotPriceHistory, not the Price List).
- Each PriceList entry is a JSON string: product.attributes, and terms.OnDemand / terms.Reserved, each term with
  priceDimensions (unit "Hrs" for an hourly rate, "Quantity" for an upfront fee) and pricePerUnit by currency;
  a Reserved term's termAttributes name LeaseContractLength, OfferingClass and PurchaseOption (AWS Billing User
  Guide, "Reading the service price list file for an Amazon Web Services service", docs.amazonaws.cn).
- EC2's product attributes used to pick the one product a plain instance is: regionCode, instanceType,
  operatingSystem Linux, tenancy Shared, preInstalledSw NA, capacitystatus Used (the same guide, EC2 attributes).
`write` changes only the two price lines of each [instance."<type>"] table (and price_is_estimate once an RI
price is the API's), each with a trailing comment naming the source and date; every other line and comment stays.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.hardware import Hardware

FILE_REGION = "cn-northwest-1"  # profiles/hardware.toml holds Ningxia's prices (its header says so)
CURRENCY = "CNY"
API_REGION = {"cn-": "cn-northwest-1"}  # the China partition's only Price List endpoint (above)
DEFAULT_API_REGION = "us-east-1"  # the aws partition's (botocore endpoints.json: api.pricing)
HOURS_PER_YEAR = 8760  # a 1-year RI's hourly part, if any, over its term
RI_TERM = {"LeaseContractLength": "1yr", "OfferingClass": "standard", "PurchaseOption": "All Upfront"}
PLAIN_INSTANCE = {"operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used"}
PRICE_KEYS = ("ri_1yr_all_upfront_cny", "on_demand_cny_per_hour")


@dataclass(frozen=True)
class Listed:
    """One instance type as the Price List API prices it."""

    instance_type: str
    on_demand_cny_per_hour: float | None
    ri_1yr_all_upfront_cny: float | None
    sku: str
    publication: str  # the entry's publicationDate


def api_region(region: str) -> str:
    return next((api for prefix, api in API_REGION.items() if region.startswith(prefix)), DEFAULT_API_REGION)


def pricing_client(region: str) -> Any:
    """A Price List client for `region`'s partition (credentials of that partition; the call reads nothing else)."""
    import boto3

    return boto3.client("pricing", region_name=api_region(region))


def filters(instance_type: str, region: str) -> list[dict[str, str]]:
    wanted = {"instanceType": instance_type, "regionCode": region, **PLAIN_INSTANCE}
    return [{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in wanted.items()]


def _amount(dimension: dict[str, Any], where: str) -> float:
    per_unit = dimension.get("pricePerUnit") or {}
    if CURRENCY not in per_unit:
        raise ProfileError(
            f"{where}: the Price List answered in {', '.join(per_unit) or 'no currency'}, not {CURRENCY}; "
            "profiles/hardware.toml holds yuan: ask the China partition's endpoint (--region cn-northwest-1)"
        )
    return float(per_unit[CURRENCY])


def parse(entry: str | dict[str, Any]) -> Listed:
    """One PriceList entry: its hourly on-demand rate and its 1-year standard all-upfront RI total."""
    doc = json.loads(entry) if isinstance(entry, str) else entry
    attrs = doc["product"]["attributes"]
    where = f"Price List {attrs.get('instanceType')} (sku {doc['product'].get('sku')})"
    terms = doc.get("terms") or {}
    on_demand = None
    for term in (terms.get("OnDemand") or {}).values():
        for dim in term["priceDimensions"].values():
            if dim.get("unit") == "Hrs" and str(dim.get("beginRange", "0")) == "0":
                on_demand = _amount(dim, where)
    ri = None
    for term in (terms.get("Reserved") or {}).values():
        if all(term.get("termAttributes", {}).get(k) == v for k, v in RI_TERM.items()):
            dims = term["priceDimensions"].values()
            upfront = sum(_amount(d, where) for d in dims if d.get("unit") == "Quantity")
            hourly = sum(_amount(d, where) for d in dims if d.get("unit") == "Hrs")
            ri = upfront + hourly * HOURS_PER_YEAR
    return Listed(attrs["instanceType"], on_demand, ri, doc["product"].get("sku", ""), doc.get("publicationDate", ""))


def fetch(client: Any, instance_types: list[str], region: str) -> dict[str, Listed]:
    """GetProducts for each type (paginated); a type the region does not price is left out."""
    out = {}
    for instance_type in instance_types:
        entries = []
        pages = client.get_paginator("get_products").paginate(
            ServiceCode="AmazonEC2", Filters=filters(instance_type, region), FormatVersion="aws_v1"
        )
        for page in pages:
            entries += [parse(e) for e in page.get("PriceList", [])]
        plain = [e for e in entries if e.on_demand_cny_per_hour is not None or e.ri_1yr_all_upfront_cny is not None]
        if len(plain) > 1:
            skus = ", ".join(e.sku for e in plain)
            raise ProfileError(f"the Price List has {len(plain)} plain Linux products for {instance_type} ({skus})")
        if plain:
            out[instance_type] = plain[0]
    return out


@dataclass(frozen=True)
class Change:
    instance_type: str
    key: str  # one of PRICE_KEYS
    pinned: float | None
    listed: float


def changes(hardware: dict[str, Hardware], listed: dict[str, Listed]) -> list[Change]:
    """Every price the API gives that the file does not hold, or holds at another value (to the cent)."""
    out = []
    for name, hw in hardware.items():
        price = listed.get(name)
        for key in PRICE_KEYS:
            value = getattr(price, key) if price else None
            pinned = getattr(hw, key)
            if value is not None and (pinned is None or not math.isclose(pinned, value, abs_tol=0.005)):
                out.append(Change(name, key, pinned, value))
    return out


def _number(value: float) -> str:
    return f"{value:.0f}" if value == int(value) else f"{value:.4f}".rstrip("0")


def write(path: Path, found: list[Change], *, region: str, today: str | None = None) -> str:
    """The file with each change written onto its price line (added under the table if missing), commented with
    the source and date; every other line as it was. Returns the new text (the caller writes it)."""
    today = today or datetime.now(UTC).date().isoformat()
    note = f"  # AWS Price List API ({region}, {CURRENCY}), read {today}"
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    for change in found:
        start, end = _table(lines, change.instance_type, path)
        text = f"{change.key} = {_number(change.listed)}{note}\n"
        at = _find(lines, start, end, change.key)
        if at is not None:
            lines[at] = text
        else:
            last = max(i for i in range(start, end) if lines[i].strip() and not lines[i].lstrip().startswith("#"))
            lines.insert(last + 1, text)
        if change.key == "ri_1yr_all_upfront_cny":
            start, end = _table(lines, change.instance_type, path)
            flag = _find(lines, start, end, "price_is_estimate")
            if flag is not None:
                lines[flag] = f"price_is_estimate = false{note}\n"
    return "".join(lines)


def _table(lines: list[str], instance_type: str, path: Path) -> tuple[int, int]:
    """[start, end) line indexes of [instance."<type>"]'s body."""
    header = f'[instance."{instance_type}"]'
    start = next((i + 1 for i, line in enumerate(lines) if line.strip() == header), None)
    if start is None:
        raise ProfileError(f"{path}: no {header} table to write {instance_type}'s prices into")
    end = next((i for i in range(start, len(lines)) if lines[i].lstrip().startswith("[")), len(lines))
    return start, end


def _find(lines: list[str], start: int, end: int, key: str) -> int | None:
    pattern = re.compile(rf"\s*{re.escape(key)}\s*=")
    return next((i for i in range(start, end) if pattern.match(lines[i])), None)
