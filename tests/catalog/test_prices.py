"""`gguf-serve-catalog prices` against botocore's Stubber giving GetProducts answers in the real API's shape.

moto 5.2.5 has no Price List backend (no moto/pricing module), so the answers are stubbed: PriceList entries are
JSON strings with product.attributes and terms.OnDemand / terms.Reserved keyed by SKU and offer-term code, each
with priceDimensions (unit Hrs or Quantity, pricePerUnit by currency), as the AWS Billing User Guide's price list
file reference describes them. The Stubber checks each request against botocore's model of the pricing API.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import boto3
import pytest
from botocore.stub import Stubber

from gguf_serve.catalog import prices
from gguf_serve.catalog.__main__ import main
from gguf_serve.catalog.loader import PROFILES_DIR, load_hardware

PUBLISHED = "2026-11-20T10:00:00Z"


def entry(instance_type: str, *, hourly: str | None, upfront: str | None, currency: str = "CNY") -> str:
    """One GetProducts PriceList item, as the API writes it (a JSON string)."""
    sku = hashlib.sha256(instance_type.encode()).hexdigest()[:16].upper()  # a SKU is 16 letters and digits
    attributes = {
        "instanceType": instance_type, "regionCode": "cn-northwest-1", "location": "China (Ningxia)",
        "locationType": "AWS Region", "operatingSystem": "Linux", "tenancy": "Shared", "preInstalledSw": "NA",
        "capacitystatus": "Used", "operation": "RunInstances", "servicecode": "AmazonEC2",
        "usagetype": f"CNW1-BoxUsage:{instance_type}",
    }  # fmt: skip

    def dimension(code: str, unit: str, amount: str, description: str) -> dict:
        return {f"{sku}.{code}": {"rateCode": f"{sku}.{code}", "unit": unit, "description": description,
                                  "beginRange": "0", "endRange": "Inf", "appliesTo": [],
                                  "pricePerUnit": {currency: amount}}}  # fmt: skip

    def reserved(code: str, length: str, option: str, klass: str, upfront_fee: str, hourly_fee: str) -> dict:
        dims = {**dimension(f"{code}.2TG2D8R56U", "Quantity", upfront_fee, "Upfront Fee"),
                **dimension(f"{code}.6YS6EN2CT7", "Hrs", hourly_fee, "Reserved hourly")}  # fmt: skip
        return {f"{sku}.{code}": {"offerTermCode": code, "sku": sku, "effectiveDate": PUBLISHED,
                                  "priceDimensions": dims, "termAttributes": {"LeaseContractLength": length,
                                  "OfferingClass": klass, "PurchaseOption": option}}}  # fmt: skip

    terms: dict = {}
    if hourly is not None:
        hours = dimension("JRTCKXETXF.6YS6EN2CT7", "Hrs", hourly, f"CNY {hourly} per On Demand Linux")
        terms["OnDemand"] = {f"{sku}.JRTCKXETXF": {
            "offerTermCode": "JRTCKXETXF", "sku": sku, "effectiveDate": PUBLISHED, "termAttributes": {},
            "priceDimensions": hours}}  # fmt: skip
    if upfront is not None:
        terms["Reserved"] = {
            **reserved("6QCMYABX3D", "1yr", "All Upfront", "standard", upfront, "0.0000000000"),
            # the terms the cost model does not use, priced so that picking one would show
            **reserved("NQ3QZPMQV9", "3yr", "All Upfront", "standard", "1", "0.0000000000"),
            **reserved("VJWZNREJX2", "1yr", "All Upfront", "convertible", "2", "0.0000000000"),
            **reserved("HU7G6KETJZ", "1yr", "Partial Upfront", "standard", "3", "0.5000000000"),
        }
    doc = {"product": {"productFamily": "Compute Instance", "attributes": attributes, "sku": sku},
           "serviceCode": "AmazonEC2", "terms": terms, "version": "20261120100000",
           "publicationDate": PUBLISHED}  # fmt: skip
    return json.dumps(doc)


def stubbed(answers: dict[str, list[str]], region: str = "cn-northwest-1") -> tuple[object, Stubber]:
    client = boto3.client("pricing", region_name=prices.api_region(region), aws_access_key_id="testing",
                          aws_secret_access_key="testing")  # fmt: skip
    stub = Stubber(client)
    for instance_type in sorted(answers):
        stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": answers[instance_type]},
            {"ServiceCode": "AmazonEC2", "Filters": prices.filters(instance_type, region), "FormatVersion": "aws_v1"},
        )
    stub.activate()
    return client, stub


def hardware_copy(tmp_path: Path) -> Path:
    path = tmp_path / "hardware.toml"
    shutil.copy(PROFILES_DIR / "hardware.toml", path)
    return path


def answers_for(path: Path, **given: str) -> dict[str, list[str]]:
    """The file's own prices as the API's answer (nothing differs), with `given` entries replacing some."""
    out = {}
    for name, hw in load_hardware(path).items():
        hourly = None if hw.on_demand_cny_per_hour is None else f"{hw.on_demand_cny_per_hour:.10f}"
        upfront = None if hw.ri_1yr_all_upfront_cny is None else f"{hw.ri_1yr_all_upfront_cny:g}"
        out[name] = [given[name]] if name in given else ([entry(name, hourly=hourly, upfront=upfront)]
                                                         if hourly or upfront else [])  # fmt: skip
    return out


def test_the_china_endpoint_is_ningxias_and_answers_for_both_regions() -> None:
    client = boto3.client("pricing", region_name=prices.api_region("cn-north-1"), aws_access_key_id="t",
                          aws_secret_access_key="t")  # fmt: skip
    assert client.meta.endpoint_url == "https://api.pricing.cn-northwest-1.amazonaws.com.cn"
    assert prices.api_region("us-west-2") == "us-east-1"


def test_parse_takes_the_hourly_rate_and_the_one_year_standard_all_upfront_ri() -> None:
    listed = prices.parse(entry("c8g.4xlarge", hourly="1.6880000000", upfront="9069"))
    assert (listed.on_demand_cny_per_hour, listed.ri_1yr_all_upfront_cny) == (1.688, 9069.0)
    assert listed.publication == PUBLISHED
    with pytest.raises(prices.ProfileError, match="answered in USD, not CNY"):
        prices.parse(entry("c8g.4xlarge", hourly="0.6", upfront=None, currency="USD"))


def test_prices_shows_what_differs_and_leaves_the_file(tmp_path: Path, monkeypatch, capsys) -> None:
    path = hardware_copy(tmp_path)
    before = path.read_text()
    given = {"c8g.4xlarge": entry("c8g.4xlarge", hourly="1.6880000000", upfront="9100"),
             "c8i.4xlarge": entry("c8i.4xlarge", hourly=None, upfront="13237")}  # fmt: skip
    client, stub = stubbed(answers_for(path, **given))
    monkeypatch.setattr(prices, "pricing_client", lambda region: client)
    assert main(["prices", "--region", "cn-northwest-1", "--hardware-file", str(path)]) == 0
    out = capsys.readouterr().out
    stub.assert_no_pending_responses()
    assert "https://api.pricing.cn-northwest-1.amazonaws.com.cn for cn-northwest-1 (CNY" in out
    assert "c8g.4xlarge ri_1yr_all_upfront_cny: 9069 -> 9100" in out
    assert "c8g.4xlarge on_demand_cny_per_hour: not in the file -> 1.688" in out
    assert "c8i.4xlarge" not in out.split("differ")[0].split("CNY")[1]  # the same price is not a change
    assert "m8g.4xlarge: not in the Price List" in out and "2 prices differ" in out
    assert path.read_text() == before


def test_write_changes_only_the_price_lines_on_a_copy(tmp_path: Path, monkeypatch, capsys) -> None:
    path = hardware_copy(tmp_path)
    before = path.read_text().splitlines()
    given = {"c8g.4xlarge": entry("c8g.4xlarge", hourly="1.6880000000", upfront="9100"),
             "g5.xlarge": entry("g5.xlarge", hourly="10.2300000000", upfront="34228"),
             "c8g.8xlarge": entry("c8g.8xlarge", hourly=None, upfront="18200")}  # fmt: skip
    client, _ = stubbed(answers_for(path, **given))
    monkeypatch.setattr(prices, "pricing_client", lambda region: client)
    assert main(["prices", "--region", "cn-northwest-1", "--hardware-file", str(path), "--write"]) == 0
    assert "wrote 4 prices" in capsys.readouterr().out
    hw = load_hardware(path)
    assert (hw["c8g.4xlarge"].ri_1yr_all_upfront_cny, hw["c8g.4xlarge"].on_demand_cny_per_hour) == (9100, 1.688)
    assert (hw["g5.xlarge"].on_demand_cny_per_hour, hw["g5.xlarge"].ri_1yr_all_upfront_cny) == (10.23, 34228)
    assert hw["c8g.8xlarge"].ri_1yr_all_upfront_cny == 18200 and hw["c8g.8xlarge"].price_is_estimate is False
    after = path.read_text().splitlines()
    assert len(after) == len(before) + 1  # c8g.4xlarge's on-demand price is a new line; the rest replaced
    changed = [line for line in after if line not in before]
    assert len(changed) == 5 and all("# AWS Price List API (cn-northwest-1, CNY), read 20" in c for c in changed)
    assert all(line.split("=")[0].strip() in (*prices.PRICE_KEYS, "price_is_estimate") for line in changed)
    comments = [line for line in before if line.lstrip().startswith("#")]
    assert comments == [line for line in after if line.lstrip().startswith("#")]  # every comment kept


def test_write_refuses_another_regions_prices(tmp_path: Path) -> None:
    path = hardware_copy(tmp_path)
    assert main(["prices", "--region", "cn-north-1", "--hardware-file", str(path), "--write"]) == 1
    assert path.read_text() == (PROFILES_DIR / "hardware.toml").read_text()


def test_an_unreachable_api_leaves_the_pinned_table(tmp_path: Path, monkeypatch, capsys) -> None:
    path = hardware_copy(tmp_path)
    client = boto3.client("pricing", region_name="cn-northwest-1", aws_access_key_id="t",
                          aws_secret_access_key="t")  # fmt: skip
    stub = Stubber(client)
    stub.add_client_error("get_products", "AccessDeniedException", "no pricing:GetProducts", 400)
    stub.activate()
    monkeypatch.setattr(prices, "pricing_client", lambda region: client)
    assert main(["prices", "--hardware-file", str(path), "--write"]) == 2
    assert "stays as it is (the pinned prices)" in capsys.readouterr().err
    assert path.read_text() == (PROFILES_DIR / "hardware.toml").read_text()
