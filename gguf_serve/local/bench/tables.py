"""The report's tables (5.1-5.4, 8) as Markdown, computed from measurements."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from gguf_serve.catalog import Architecture
from gguf_serve.local.bench import cost
from gguf_serve.local.bench.results import Measurement, Results
from gguf_serve.local.bench.runner import harness_generation_rate

TOK_S_ROUNDING = 0.005  # the report prints tok/s with two decimals
NONE = "—"


def markdown(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def family_prefix(results: Results) -> str:
    """The model-name prefix every measured model shares ("Qwen3.6-"), dropped in the compact tables."""
    names = sorted({m.model for m in results.measurements})
    if len(names) < 2:
        return ""
    common = os.path.commonprefix(names)
    return common[: common.rfind("-") + 1]


def kind(m: Measurement) -> str:
    return "MoE" if m.moe else "Dense"


def short_model(m: Measurement, prefix: str) -> str:
    return f"{m.model.removeprefix(prefix)} {kind(m)}"


def on_off(flag: bool) -> str:
    return "ON" if flag else "OFF"


def pct(fraction: float | None) -> str:
    return NONE if fraction is None else f"{fraction * 100:.1f}%"


def full_data(results: Results) -> str:
    """5.1: every configuration."""
    rows = [
        [
            m.instance_type,
            m.hardware,
            f"{m.model} ({kind(m)})",
            on_off(m.mtp),
            f"{m.total_time_s:.1f}",
            f"{m.effective_tok_s:.2f}",
            pct(m.draft_acceptance),
        ]
        for m in results.measurements
    ]
    header = ["Instance", "Hardware", "Model", "MTP", "Total time (s)", "Effective tok/s", "Draft acceptance"]
    return markdown(header, rows)


@dataclass(frozen=True)
class MtpEffect:
    off: Measurement
    on: Measurement
    change_pct: float  # computed from the two tok/s values
    shown_pct: float  # what the table prints: the source's own figure when the inputs' rounding explains the gap
    published: bool


def mtp_effects(results: Results) -> list[MtpEffect]:
    out = []
    for on in results.measurements:
        if not on.mtp:
            continue
        off = results.find(instance_type=on.instance_type, model=on.model, mtp=False)
        if off is None:
            continue
        change = (on.effective_tok_s / off.effective_tok_s - 1) * 100
        shown, published = round(change, 1), False
        source = results.published_mtp_change_pct.get((on.instance_type, on.model))
        if source is not None and _explained_by_rounding(off.effective_tok_s, on.effective_tok_s, source):
            shown, published = source, True
        out.append(MtpEffect(off=off, on=on, change_pct=change, shown_pct=shown, published=published))
    return sorted(out, key=lambda e: e.shown_pct, reverse=True)


def _explained_by_rounding(off: float, on: float, source_pct: float) -> bool:
    """True when tok/s values that round to `off` and `on` can give `source_pct` (itself rounded to 0.1)."""
    lo = ((on - TOK_S_ROUNDING) / (off + TOK_S_ROUNDING) - 1) * 100 - 0.05
    hi = ((on + TOK_S_ROUNDING) / (off - TOK_S_ROUNDING) - 1) * 100 + 0.05
    return lo <= source_pct <= hi


def mtp_effect(results: Results) -> str:
    """5.2: MTP on versus off for each configuration measured both ways, biggest gain first."""
    prefix = family_prefix(results)
    effects = mtp_effects(results)
    if not effects:
        return "_No configuration was measured both with and without MTP._"
    rows = []
    notes = []
    for e in effects:
        marker = ""
        if e.published and round(e.change_pct, 1) != e.shown_pct:
            marker = " ¹"
            notes.append(
                f"{e.on.instance_type} {short_model(e.on, prefix)}: {e.shown_pct:+.1f}% as published; "
                f"the rounded tok/s above give {e.change_pct:+.1f}%"
            )
        rows.append(
            [
                e.on.instance_type,
                e.on.hardware,
                short_model(e.on, prefix),
                f"{e.off.effective_tok_s:.2f}",
                f"{e.on.effective_tok_s:.2f}",
                f"{e.shown_pct:+.1f}%{marker}",
                pct(e.on.draft_acceptance),
            ]
        )
    header = ["Instance", "Hardware", "Model", "No MTP (tok/s)", "MTP (tok/s)", "Change", "Draft acceptance"]
    text = markdown(header, rows)
    if notes:
        text += (
            "\n\n¹ The source computed the change from unrounded tok/s; its figure is within the rounding of the "
            "two-decimal values (" + "; ".join(notes) + ")."
        )
    return text


def _cpu_instances(results: Results) -> tuple[Measurement | None, Measurement | None]:
    """The first measured ARM CPU-only and x86 CPU-only instances (the report's Graviton4/Intel ratio)."""
    arm = x86 = None
    for m in results.measurements:
        hw = cost.priced_hardware(results.catalog).get(m.instance_type)
        if hw is None or hw.has_gpu:
            continue
        if hw.architecture is Architecture.ARM64 and arm is None:
            arm = m
        if hw.architecture is Architecture.X86_64 and x86 is None:
            x86 = m
    return arm, x86


def platform_comparison(results: Results) -> str:
    """5.3: tok/s per instance for each model and MTP setting, with the ARM/x86 CPU ratio."""
    prefix = family_prefix(results)
    instances: dict[str, str] = {}
    configs: dict[tuple[str, bool], Measurement] = {}
    for m in results.measurements:
        instances.setdefault(m.instance_type, m.hardware)
        configs.setdefault((m.model, m.mtp), m)
    arm, x86 = _cpu_instances(results)
    header = ["Model", "MTP", *(f"{i} ({hw})" for i, hw in instances.items())]
    if arm and x86:
        header.append(f"{arm.hardware.split()[0]}/{x86.hardware.split()[0]}")
    rows = []
    for model in dict.fromkeys(m.model for m in results.measurements):
        for mtp in (False, True):
            sample = configs.get((model, mtp))
            if sample is not None:
                rows.append(_platform_row(results, sample, instances, arm, x86, prefix))
    return markdown(header, rows)


def _platform_row(
    results: Results,
    sample: Measurement,
    instances: dict[str, str],
    arm: Measurement | None,
    x86: Measurement | None,
    prefix: str,
) -> list[str]:
    model, mtp = sample.model, sample.mtp
    row = [short_model(sample, prefix), on_off(mtp)]
    for instance in instances:
        m = results.find(instance_type=instance, model=model, mtp=mtp)
        row.append(f"{m.effective_tok_s:.2f}" if m else NONE)
    if arm and x86:
        a = results.find(instance_type=arm.instance_type, model=model, mtp=mtp)
        b = results.find(instance_type=x86.instance_type, model=model, mtp=mtp)
        row.append(f"{a.effective_tok_s / b.effective_tok_s:.2f}x" if a and b else NONE)
    return row


def moe_vs_dense(results: Results) -> str:
    """5.4: MoE speed-up over the dense model on the same hardware, MTP off."""
    prefix = family_prefix(results)
    rows = []
    dense_names, moe_names = set(), set()
    for instance in dict.fromkeys(m.instance_type for m in results.measurements):
        off = [m for m in results.measurements if m.instance_type == instance and not m.mtp]
        dense = next((m for m in off if not m.moe), None)
        moe = next((m for m in off if m.moe), None)
        if dense and moe:
            dense_names.add(short_model(dense, prefix))
            moe_names.add(short_model(moe, prefix))
            rows.append(
                [
                    f"{instance} ({dense.hardware})",
                    f"{dense.effective_tok_s:.2f}",
                    f"{moe.effective_tok_s:.2f}",
                    f"{moe.effective_tok_s / dense.effective_tok_s:.2f}x",
                ]
            )
    if not rows:
        return "_No hardware was measured with both a dense and an MoE model (MTP off)._"
    dense_h = f"{dense_names.pop()} (tok/s)" if len(dense_names) == 1 else "Dense (tok/s)"
    moe_h = f"{moe_names.pop()} (tok/s)" if len(moe_names) == 1 else "MoE (tok/s)"
    return markdown(["Hardware", dense_h, moe_h, "MoE speed-up"], rows)


def best_per_instance(results: Results) -> list[Measurement]:
    """The fastest configuration per priced instance, in order of first appearance (the report's section 8)."""
    best: dict[str, Measurement] = {}
    for m in results.measurements:
        if m.instance_type in cost.priced_hardware(results.catalog) and (
            m.instance_type not in best or m.effective_tok_s > best[m.instance_type].effective_tok_s
        ):
            best[m.instance_type] = m
    return list(best.values())


def cost_table(results: Results, *, utilization: float = 1.0) -> str:
    """Section 8: yuan per million output tokens for each instance's best configuration."""
    prefix = family_prefix(results)
    rows = []
    for m in best_per_instance(results):
        hardware = cost.priced_hardware(results.catalog)
        od = cost.on_demand_cost(m.instance_type, m.effective_tok_s, utilization, hardware=hardware)
        od_cell = cost.money(od.cny_per_million, estimate=True, unit="¥") if od else NONE
        head = [m.instance_type, f"{short_model(m, prefix)}, MTP {on_off(m.mtp)}", f"{m.effective_tok_s:.2f}"]
        if not cost.has_ri(m.instance_type, hardware):  # a SageMaker ml type: on demand only
            rows.append([*head, NONE, NONE, NONE, od_cell])
            continue
        ri = cost.ri_cost(m.instance_type, m.effective_tok_s, utilization, hardware=hardware)
        yearly = ri.yearly_cny or 0.0
        rows.append(
            [
                *head,
                cost.money(yearly, decimals=0 if yearly == int(yearly) else 2, estimate=ri.estimate),
                cost.money(ri.monthly_cny, estimate=ri.estimate),
                cost.money(ri.cny_per_million, estimate=ri.estimate, unit="¥"),
                od_cell,
            ]
        )
    if not rows:
        return "_No measured instance has a price in the catalog._"
    header = [
        "Instance",
        "Best configuration",
        "tok/s",
        "RI yearly (¥)",
        "RI monthly (¥)",
        "¥/M output tokens (RI)",
        "¥/M output tokens (on-demand, estimate)",
    ]
    return (
        markdown(header, rows)
        + f"\n\nUtilization {utilization:.0%}. Convention: {cost.CONVENTION}. ~ marks an estimate."
    )


def concurrency_table(results: Results) -> str:
    rows = []
    for doc in results.concurrency:
        s = doc["summary"]

        def trio(key: str, fmt: str, s: dict = s) -> str:
            v = s.get(key)
            return NONE if not v else "/".join(format(v[p], fmt) for p in ("p50", "p95", "p99"))

        rows.append(
            [
                doc.get("profile") or NONE,
                doc.get("model") or NONE,
                str(s["concurrency"]),
                str(s["requests"]),
                str(s["errors"]),
                f"{s['aggregate_tok_s']:.2f}",
                trio("ttft_ms", ".0f"),
                trio("itl_ms", ".1f"),
                trio("latency_s", ".2f"),
            ]
        )
    header = [
        "Profile",
        "Model",
        "Clients",
        "Requests",
        "Errors",
        "Aggregate tok/s",
        "TTFT P50/P95/P99 (ms)",
        "ITL P50/P95/P99 (ms)",
        "Latency P50/P95/P99 (s)",
    ]
    return markdown(header, rows)


def per_run(results: Results) -> str:
    """Every measured request of measured results: the harness's clock next to the server's timings."""
    rows = []
    for doc in results.sequential:
        for r in (r for r in doc["runs"] if not r["warmup"] and "error" not in r):
            t = r["timings"]
            harness = harness_generation_rate(r["wall_s"], t)
            rows.append(
                [
                    doc.get("profile") or NONE,
                    str(r["index"] - doc["method"]["warmup"] + 1),
                    str(r["completion_tokens"]),
                    f"{r['wall_s']:.2f}",
                    f"{r['effective_tok_s']:.2f}",
                    f"{t['prompt_per_second']:.1f}" if t else NONE,
                    f"{t['predicted_per_second']:.2f}" if t else NONE,
                    f"{harness:.2f}" if harness else NONE,
                    f"{r['overhead_ms']:.1f}" if r["overhead_ms"] is not None else NONE,
                ]
            )
    header = [
        "Profile",
        "Run",
        "Tokens",
        "Total time (s)",
        "Effective tok/s",
        "Server prompt tok/s",
        "Server generation tok/s",
        "Harness generation tok/s",
        "Harness overhead (ms)",
    ]
    return markdown(header, rows)


def report(results: Results, *, utilization: float = 1.0) -> str:
    parts = []
    if results.measurements:
        parts += [
            "## 5.1 Full data",
            full_data(results),
            "## 5.2 MTP effect",
            mtp_effect(results),
            "## 5.3 Platform comparison",
            platform_comparison(results),
            "## 5.4 MoE vs dense (same hardware, MTP off)",
            moe_vs_dense(results),
            "## 8 Cost",
            cost_table(results, utilization=utilization),
        ]
    if results.sequential:
        parts += ["## Every measured request", per_run(results)]
    if results.concurrency:
        parts += ["## Concurrency", concurrency_table(results)]
    return "\n\n".join(parts) + "\n"
