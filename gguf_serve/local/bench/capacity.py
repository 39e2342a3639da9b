"""The capacity curve: the report's method at rising concurrency, and the knee that sets a profile's slots.

Each step is one uninterrupted concurrency phase (gguf_serve.local.bench.runner.run_concurrent) of N streaming
clients. Per step: aggregate tok/s (all completion tokens / the phase's wall time), per-stream tok/s (the mean of
each request's completion tokens / its wall time, queueing included: what one user sees), TTFT P50/P95,
inter-token P95, failures and 429s, and yuan per million output tokens with the instance busy at that load.
The knee is the last step worth its streams: the next one adds less than `min_growth` of aggregate tok/s, or
its P95 TTFT passes the limit, or requests fail. Its stream count is the `parallel` (slots) to write into the
profile; the fleet's scaling target follows from it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gguf_serve.catalog import Catalog, ServingProfile
from gguf_serve.local.bench import cost, roofline, runner
from gguf_serve.local.bench.tables import NONE, markdown

SCHEMA = "gguf-serve-bench-capacity/1"
DEFAULT_MAX_STREAMS = 8
KNEE_GROWTH = 0.10  # a step must add 10% aggregate tok/s to be worth its streams
# P95 time to first token past which a load is over capacity: the stacks alarm at these (stacks/monitoring.py
# TTFT_P95_ALARM_S, which this layer cannot import; tests/local/bench/test_capacity.py keeps the two equal).
TTFT_P95_LIMIT_S = {"gpu": 10.0, "cpu": 30.0}


def doubling(max_streams: int) -> list[int]:
    """1, 2, 4, ... up to max_streams, which is always the last step."""
    steps, n = [], 1
    while n < max_streams:
        steps.append(n)
        n *= 2
    return [*steps, max_streams]


def parse_streams(text: str) -> list[int]:
    """'1,2,4,8' -> [1, 2, 4, 8]: rising, each at least 1."""
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ValueError(f"--streams {text!r}: a comma-separated list of stream counts, e.g. 1,2,4,8") from None
    if not values or values[0] < 1 or any(b <= a for a, b in zip(values, values[1:], strict=False)):
        raise ValueError(f"--streams {text!r}: stream counts must rise from at least 1, e.g. 1,2,4,8")
    return values


@dataclass(frozen=True)
class Price:
    instance_type: str
    pricing: str  # cost.Cost.pricing
    monthly_cny: float
    estimate: bool
    note: str  # what a reader must know: "priced as c8g.4xlarge, the base profile's instance"

    def cny_per_million(self, tok_s: float) -> float | None:
        return cost.cny_per_million(tok_s, self.monthly_cny) if tok_s > 0 else None


def price_for(instance_type: str, catalog: Catalog, *, note: str = "") -> Price | None:
    """The catalog's price for the instance: the report's RI basis where there is one, else on-demand."""
    hardware = cost.priced_hardware(catalog)
    if instance_type not in hardware:
        return None
    if cost.has_ri(instance_type, hardware):
        c = cost.ri_cost(instance_type, 1.0, hardware=hardware)
    else:
        c = cost.on_demand_cost(instance_type, 1.0, hardware=hardware)
    if c is None:
        return None
    return Price(instance_type, c.pricing, c.monthly_cny, c.estimate, note)


def base_profile(name: str, catalog: Catalog) -> ServingProfile | None:
    """The catalog profile a run's --profile names (local-<p>: p, whose file a knee would change)."""
    return catalog.profiles.get(name) or catalog.profiles.get(name.removeprefix("local-"))


def step_summary(
    rows: list[dict[str, Any]], wall: float, streams: int, *, price: Price | None,
    model_bytes: roofline.ModelBytes | None, peak_gb_s: float | None,
) -> dict[str, Any] | None:  # fmt: skip
    """runner.summarize_concurrent plus what the curve needs: per-stream tok/s, ¥/Mtok and the roofline."""
    ok = [r for r in rows if runner.measured(r)]
    if not ok:
        return None
    s = runner.summarize_concurrent(rows, wall, streams)
    s["per_stream_tok_s"] = s["per_request_tok_s"]["mean"]
    s["cny_per_million"] = price.cny_per_million(s["aggregate_tok_s"]) if price else None
    if model_bytes is not None:
        roof = roofline.roofline(
            model_bytes, tok_s=s["aggregate_tok_s"], depth=roofline.mean_depth(ok), streams=streams,
            passes=roofline.passes_per_token([r["timings"] for r in ok]), peak_gb_s=peak_gb_s,
        )  # fmt: skip
        s["roofline"] = roof.to_json()
    return s


@dataclass(frozen=True)
class Knee:
    streams: int | None  # the slots to write; None: not even the first step holds
    reason: str  # why the curve stops there, with the numbers
    limited_by: str  # "growth", "ttft", "failures" or "none" (still growing at the last step)


def find_knee(steps: list[dict[str, Any]], *, min_growth: float, ttft_limit_s: float) -> Knee:
    """The fewest streams past which no step adds min_growth to aggregate tok/s, among the steps that hold (the
    curve ends at the first step whose P95 TTFT passes the limit or whose requests fail). Against the best step,
    not the next one: a step that a busy neighbour slowed does not end the curve early."""
    held: list[dict[str, Any]] = []
    stop = kind = ""
    for step in sorted(steps, key=lambda s: s["streams"]):
        n, s = step["streams"], step["summary"]
        if s is None or s["errors"]:
            stop, kind = f"{s['errors'] if s else 'every'} requests failed at {n} streams", "failures"
            break
        ttft = s["ttft_ms"]["p95"] / 1000 if s.get("ttft_ms") else None
        if ttft is not None and ttft > ttft_limit_s:
            stop, kind = f"P95 TTFT {ttft:.1f} s at {n} streams passes the {ttft_limit_s:g} s limit", "ttft"
            break
        held.append(step)
    if not held:
        return Knee(None, stop or "no step was measured", kind or "failures")
    rate = {st["streams"]: st["summary"]["aggregate_tok_s"] for st in held}
    best = max(rate.values())
    knee = next(n for n, r in rate.items() if r * (1 + min_growth) >= best)
    later = {n: r for n, r in rate.items() if n > knee}
    if later:
        top = max(later, key=later.__getitem__)
        reason = (
            f"aggregate {rate[knee]:.2f} tok/s at {knee} streams; more streams reach at most {later[top]:.2f} "
            f"({later[top] / rate[knee] - 1:+.1%} at {top}), under the {min_growth:.0%} a step must add"
        )
        return Knee(knee, reason + (f"; then {stop}" if stop else ""), "growth")
    if stop:
        return Knee(knee, stop, kind)
    return Knee(knee, f"aggregate still grows at {knee} streams, the last step: measure more (--max-streams "
                f"{knee * 2})", "none")  # fmt: skip


def _key_line(path: Path, table: str, key: str) -> tuple[int, str | None]:
    """(line number, the line) of `key = ...` in [table] of a TOML file; without it, the table header's line."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header, current = 0, ""
    for i, text in enumerate(lines, 1):
        stripped = text.strip()
        if stripped.startswith("["):
            current = stripped.strip("[]").strip()
            header = i if current == table else header
        elif current == table and re.match(rf"{re.escape(key)}\s*=", stripped):
            return i, text
    return header, None


def recommendation(knee: Knee, profile: ServingProfile | None, catalog: Catalog, *, measured_on: str) -> list[str]:
    """What to write into the profile, with its file and line, and the scaling target that follows."""
    if profile is None:
        return ["no catalog profile named by --profile: nothing to write (pass --profile graviton-moe, ...)"]
    if knee.streams is None:
        return [f"not even the first step holds ({knee.reason}): keep parallel = 1 and look at the host first"]
    path = catalog.root / "serving" / f"{profile.name}.toml"
    shown = path.relative_to(catalog.root.parent) if path.is_relative_to(catalog.root.parent) else path
    number, text = _key_line(path, "server", "parallel")
    now = profile.server.parallel
    where = f"{shown}:{number}" if text else f"{shown}:{number} (under [server], a new line)"
    lines = [f"write into {where}: parallel = {knee.streams}   (now {now})"]
    if profile.mtp and knee.streams > 1:
        lines.append("  but this profile runs MTP, which keeps parallel = 1 (draft acceptance falls with more slots)")
    ratio = profile.fleet.scaling.target_busy_slot_ratio
    r_line, r_text = _key_line(path, "fleet", "target_busy_slot_ratio")
    source = f"{shown}:{r_line}" if r_text else "the fleet default, gguf_serve/catalog/fleet.py"
    lines.append(
        f"scaling: target_busy_slot_ratio {ratio:g} ({source}) holds {ratio * knee.streams:.2f} busy slots per "
        f"instance; SageMaker's ConcurrentRequestsPerModel target follows: {round(knee.streams * ratio, 2):g}"
    )
    if measured_on != profile.hardware.instance_type:
        lines.append(
            f"  measured on {measured_on}, not {profile.hardware.instance_type}: the profile's knee comes from a run "
            "against its own stack"
        )
    return lines


def streams_text(n: int | None) -> str:
    return "none" if n is None else f"{n} stream{'' if n == 1 else 's'}"


def _load(step: dict[str, Any]) -> str:
    """The client's 1-minute load average before and after the step: above its CPUs, neighbours shared them."""
    load = step.get("client_loadavg_1m") or []
    return "/".join(f"{v:.1f}" for v in load if v is not None) or NONE


def _ms(spread: dict[str, float] | None, q: str) -> str:
    return f"{spread[q]:.0f}" if spread else NONE


def table(doc: dict[str, Any]) -> str:
    """One row per finished step."""
    price = doc.get("price")
    rows = []
    for step in doc["steps"]:
        s = step["summary"]
        if s is None:
            failed = [r for r in step["runs"] if not r["warmup"]]
            limited = sum(1 for r in failed if r.get("status") == 429)
            rows.append([str(step["streams"]), "0", str(len(failed)), str(limited), *[NONE] * 8, _load(step)])
            continue
        rf = s.get("roofline")
        cny = s.get("cny_per_million")
        rows.append([
            str(step["streams"]),
            str(s["requests"]),
            str(s["errors"]),
            str(s.get("rate_limited", 0)),
            f"{s['aggregate_tok_s']:.2f}",
            f"{s['per_stream_tok_s']:.2f}",
            f"{_ms(s['ttft_ms'], 'p50')}/{_ms(s['ttft_ms'], 'p95')}",
            f"{s['itl_ms']['p95']:.1f}" if s.get("itl_ms") else NONE,
            cost.money(cny, estimate=price["estimate"], unit="¥") if cny is not None else NONE,
            f"{rf['bytes_per_token'] / roofline.GB:.3f}" if rf else NONE,
            f"{rf['implied_gb_s']:.1f}" if rf else NONE,
            f"{rf['efficiency']:.0%}" if rf and rf.get("efficiency") is not None else NONE,
            _load(step),
        ])  # fmt: skip
    header = ["Streams", "Requests", "Failed", "429", "Aggregate tok/s", "Per-stream tok/s", "TTFT P50/P95 (ms)",
              "ITL P95 (ms)", "¥/M output tokens", "GB/token", "Implied GB/s", "Of probe", "Client load"]  # fmt: skip
    return markdown(header, rows)


def caption(doc: dict[str, Any]) -> str:
    """Under the table: what the price and the roofline are, in two sentences."""
    parts = []
    price = doc.get("price")
    if price:
        kind = "1-year RI all upfront / 12" if price["pricing"] == "ri-1yr-all-upfront" else "on-demand x 720 h"
        parts.append(
            f"¥/M at each load with the instance busy all month: {price['instance_type']} "
            f"{cost.money(price['monthly_cny'], estimate=price['estimate'], unit='¥')} a month ({kind})"
            + (f"; {price['note']}" if price.get("note") else "")
            + "."
        )
    else:
        parts.append("No catalog price for this instance: no ¥/M column (pass --price-instance).")
    bw = doc.get("bandwidth")
    if doc.get("model_bytes"):
        parts.append(f"GB/token: {doc['model_bytes']['basis']}.")
    if bw:
        parts.append(f"Probe: {bw['gb_s']:.1f} GB/s read by {bw['threads']} threads on {bw['host']}.")
    cpus = (doc.get("harness") or {}).get("client_cpus")
    if cpus:
        parts.append(f"Client load: the 1-minute load average before/after each step, on {cpus} CPUs.")
    return " ".join(parts)
