"""Yuan per million output tokens, the report's section 8, with its month convention made explicit.

The report divides the yearly RI price by 12 for the monthly cost, and counts a month of tokens as 30 days of
seconds: ¥/M = (yearly / 12) / (tok/s * 30 * 86400 / 1e6). The two months differ (365/12 = 30.42 days), which
makes the report's ¥/M about 1.4% higher than yearly / tokens-per-year; we keep its convention so the numbers match,
and say so wherever a number is printed. On-demand uses the same 30-day month (720 hours).
"""

from __future__ import annotations

from dataclasses import dataclass

from gguf_serve.catalog import Catalog, Hardware

MONTHS_PER_YEAR = 12
TOKEN_MONTH_S = 30 * 86400
ON_DEMAND_HOURS_PER_MONTH = 30 * 24
CONVENTION = (
    "monthly = 1-year RI all-upfront price / 12; tokens per month = tok/s x utilization x 30 days x 86,400 s "
    "(the report's convention); on-demand monthly = hourly x 720 h"
)


@dataclass(frozen=True)
class Cost:
    instance_type: str
    pricing: str  # "ri-1yr-all-upfront" or "on-demand"
    tok_s: float
    utilization: float
    yearly_cny: float | None  # RI only
    monthly_cny: float
    cny_per_million: float
    estimate: bool  # the price is not a published Ningxia price


def priced_hardware(catalog: Catalog) -> dict[str, Hardware]:
    """Every type a result can name: the catalog's EC2 types and the SageMaker ml types (profiles/sagemaker.toml,
    on-demand only: SageMaker sells no RIs; each ml type's price is its own, an estimate until the account's)."""
    hosted = {h.ml_type: h.hardware(catalog.hardware[h.ec2_type]) for h in catalog.hosting.values()}
    return {**catalog.hardware, **hosted}


def has_ri(instance_type: str, hardware: dict[str, Hardware]) -> bool:
    return _lookup(instance_type, hardware).ri_1yr_all_upfront_cny is not None


def cny_per_million(tok_s: float, monthly_cny: float, utilization: float = 1.0) -> float:
    if tok_s <= 0 or not 0 < utilization <= 1:
        raise ValueError(f"need tok/s > 0 and 0 < utilization <= 1 (got {tok_s}, {utilization})")
    return monthly_cny / (tok_s * utilization * TOKEN_MONTH_S / 1e6)


def _lookup(instance_type: str, table: dict[str, Hardware]) -> Hardware:
    if instance_type not in table:
        raise ValueError(f"no price for {instance_type!r}: the catalog knows {', '.join(sorted(table))}")
    return table[instance_type]


def ri_cost(instance_type: str, tok_s: float, utilization: float = 1.0, *, hardware: dict[str, Hardware]) -> Cost:
    """hardware: the catalog's instance types (Catalog.hardware), where the price comes from."""
    hw = _lookup(instance_type, hardware)
    if hw.ri_1yr_all_upfront_cny is None:
        raise ValueError(f"the catalog has no 1-year RI price for {instance_type}")
    monthly = hw.ri_1yr_all_upfront_cny / MONTHS_PER_YEAR
    return Cost(
        instance_type=instance_type,
        pricing="ri-1yr-all-upfront",
        tok_s=tok_s,
        utilization=utilization,
        yearly_cny=hw.ri_1yr_all_upfront_cny,
        monthly_cny=monthly,
        cny_per_million=cny_per_million(tok_s, monthly, utilization),
        estimate=hw.price_is_estimate,
    )


def on_demand_cost(
    instance_type: str, tok_s: float, utilization: float = 1.0, *, hardware: dict[str, Hardware]
) -> Cost | None:
    """None when the catalog has no on-demand price; always an estimate (no Ningxia on-demand price is known)."""
    hw = _lookup(instance_type, hardware)
    if hw.on_demand_cny_per_hour is None:
        return None
    monthly = hw.on_demand_cny_per_hour * ON_DEMAND_HOURS_PER_MONTH
    return Cost(
        instance_type=instance_type,
        pricing="on-demand",
        tok_s=tok_s,
        utilization=utilization,
        yearly_cny=None,
        monthly_cny=monthly,
        cny_per_million=cny_per_million(tok_s, monthly, utilization),
        estimate=True,
    )


def money(value: float, *, decimals: int = 2, estimate: bool = False, unit: str = "") -> str:
    """Thousands separators, `~` in front of an estimate: money(1511.5, estimate=True, unit="¥") == "~¥1,511.50"."""
    text = f"{unit}{value:,.{decimals}f}"
    return f"~{text}" if estimate else text
