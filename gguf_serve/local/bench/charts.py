"""The report's figures as PNG: throughput (5.1), MTP effect (5.2), platform comparison (5.3), cost (8)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # headless: no display on servers and in CI

import matplotlib.pyplot as plt  # noqa: E402 - the backend must be chosen first

from gguf_serve.local.bench import cost  # noqa: E402
from gguf_serve.local.bench.results import Measurement, Results  # noqa: E402
from gguf_serve.local.bench.runner import harness_generation_rate  # noqa: E402
from gguf_serve.local.bench.tables import (  # noqa: E402
    best_per_instance,
    family_prefix,
    mtp_effects,
    on_off,
    short_model,
)

OFF_COLOR, ON_COLOR = "#4C72B0", "#DD8452"
PALETTE = ["#4C72B0", "#55A868", "#C44E52", "#8172B2", "#CCB974", "#64B5CD"]
DPI = 100


def _label(m: Measurement, prefix: str) -> str:
    return f"{m.instance_type}\n{short_model(m, prefix)}"


def _save(fig: plt.Figure, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=DPI, bbox_inches="tight")  # keeps legends placed below the axes
    plt.close(fig)
    return path


def throughput(results: Results, path: Path) -> Path:
    prefix = family_prefix(results)
    ms = results.measurements
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(ms) + 1.2))
    labels = [f"{m.instance_type} {short_model(m, prefix)} MTP {on_off(m.mtp)}" for m in ms]
    bars = ax.barh(labels, [m.effective_tok_s for m in ms], color=[ON_COLOR if m.mtp else OFF_COLOR for m in ms])
    ax.bar_label(bars, fmt="%.2f", padding=3)
    ax.invert_yaxis()
    ax.set_xlabel("effective tok/s (completion tokens / wall time, one request at a time)")
    ax.set_title("Single-stream throughput")
    ax.margins(x=0.15)
    return _save(fig, path)


def mtp_effect(results: Results, path: Path) -> Path | None:
    effects = mtp_effects(results)
    if not effects:
        return None
    prefix = family_prefix(results)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    x = range(len(effects))
    width = 0.38
    off = ax.bar(
        [i - width / 2 for i in x], [e.off.effective_tok_s for e in effects], width, label="MTP off", color=OFF_COLOR
    )
    on = ax.bar(
        [i + width / 2 for i in x], [e.on.effective_tok_s for e in effects], width, label="MTP on", color=ON_COLOR
    )
    ax.bar_label(off, fmt="%.2f", fontsize=8)
    ax.bar_label(on, labels=[f"{e.on.effective_tok_s:.2f}\n{e.shown_pct:+.1f}%" for e in effects], fontsize=8)
    ax.set_xticks(list(x), [_label(e.on, prefix) for e in effects], fontsize=8)
    ax.set_ylabel("effective tok/s")
    ax.set_title("MTP effect (speculative decoding with the model's MTP head)")
    ax.legend()
    ax.margins(y=0.2)
    return _save(fig, path)


def platform(results: Results, path: Path) -> Path:
    prefix = family_prefix(results)
    instances = list(dict.fromkeys(m.instance_type for m in results.measurements))
    models = list(dict.fromkeys(m.model for m in results.measurements))
    configs = sorted(
        dict.fromkeys((m.model, m.mtp) for m in results.measurements), key=lambda c: (models.index(c[0]), c[1])
    )
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(instances)
    for k, instance in enumerate(instances):
        values, positions = [], []
        for i, (model, mtp) in enumerate(configs):
            m = results.find(instance_type=instance, model=model, mtp=mtp)
            if m:
                values.append(m.effective_tok_s)
                positions.append(i - 0.4 + width * (k + 0.5))
        bars = ax.bar(positions, values, width, label=instance, color=PALETTE[k % len(PALETTE)])
        ax.bar_label(bars, fmt="%.2f", fontsize=6)
    names = []
    for model, mtp in configs:
        sample = next(m for m in results.measurements if (m.model, m.mtp) == (model, mtp))
        names.append(f"{short_model(sample, prefix)}\nMTP {on_off(mtp)}")
    ax.set_xticks(range(len(configs)), names, fontsize=8)
    ax.set_ylabel("effective tok/s")
    ax.set_title("Platform comparison")
    ax.legend()
    ax.margins(y=0.15)
    return _save(fig, path)


def cost_chart(results: Results, path: Path, *, utilization: float = 1.0) -> Path | None:
    best = best_per_instance(results)
    if not best:
        return None
    prefix = family_prefix(results)
    costs = [
        cost.ri_cost(m.instance_type, m.effective_tok_s, utilization, hardware=results.catalog.hardware) for m in best
    ]
    labels = [f"{m.instance_type}\n{short_model(m, prefix)}\nMTP {on_off(m.mtp)}" for m in best]
    colors = [PALETTE[i % len(PALETTE)] for i in range(len(best))]
    fig, axes = plt.subplots(1, 3, figsize=(10, 4))
    panels = [
        ("tok/s", [m.effective_tok_s for m in best], "%.2f"),
        ("RI monthly (CNY)", [c.monthly_cny for c in costs], "%.0f"),
        (f"CNY per million output tokens\n(utilization {utilization:.0%})", [c.cny_per_million for c in costs], "%.2f"),
    ]
    for ax, (title, values, fmt) in zip(axes, panels, strict=True):
        bars = ax.bar(range(len(best)), values, color=colors)
        ax.bar_label(bars, fmt=fmt, fontsize=8)
        ax.set_xticks(range(len(best)), labels, fontsize=7)
        ax.set_title(title, fontsize=10)
        ax.margins(y=0.15)
    fig.suptitle("Cost: 1-year RI all upfront, cn-northwest-1", fontsize=11)
    return _save(fig, path)


def concurrency(results: Results, path: Path) -> Path | None:
    docs = [d for d in results.concurrency if d["summary"].get("latency_s")]
    if not docs:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.8))
    quantiles = ("p50", "p95", "p99")
    width = 0.8 / len(docs)
    for k, doc in enumerate(docs):
        s = doc["summary"]
        label = f"{doc.get('profile')} x{s['concurrency']} ({s['aggregate_tok_s']:.1f} tok/s)"
        for ax, key in zip(axes, ("ttft_ms", "latency_s"), strict=True):
            if s.get(key):
                ax.bar(
                    [i - 0.4 + width * (k + 0.5) for i in range(3)],
                    [s[key][q] for q in quantiles],
                    width,
                    label=label,
                    color=PALETTE[k % len(PALETTE)],
                )
    for ax, title in zip(axes, ("time to first token (ms)", "request latency (s)"), strict=True):
        ax.set_xticks(range(3), [q.upper() for q in quantiles])
        ax.set_title(title, fontsize=10)
    axes[0].legend(fontsize=7)
    return _save(fig, path)


def harness_vs_server(results: Results, path: Path) -> Path | None:
    """Per measured request: effective tok/s, the harness's generation rate and the server's, side by side."""
    runs = [
        (doc, r)
        for doc in results.sequential
        for r in doc["runs"]
        if not r["warmup"] and "error" not in r and r["timings"]
    ]
    if not runs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.2))
    width = 0.27
    series = [
        ("effective (tokens / wall, prompt included)", [r["effective_tok_s"] for _, r in runs], OFF_COLOR),
        (
            "harness generation (server's tokens / (wall - prompt_ms))",
            [harness_generation_rate(r["wall_s"], r["timings"]) or 0.0 for _, r in runs],
            "#55A868",
        ),
        ("server predicted_per_second", [r["timings"]["predicted_per_second"] for _, r in runs], ON_COLOR),
    ]
    for k, (label, values, color) in enumerate(series):
        bars = ax.bar([i + (k - 1) * width for i in range(len(runs))], values, width, label=label, color=color)
        ax.bar_label(bars, fmt="%.1f", fontsize=7)
    many = len(results.sequential) > 1
    names = [f"{doc.get('profile')}\nrun {n + 1}" if many else f"run {n + 1}" for n, (doc, _) in enumerate(runs)]
    ax.set_xticks(range(len(runs)), names, fontsize=8)
    ax.set_ylabel("tok/s")
    ax.set_title(f"Harness clock vs llama-server timings ({runs[0][0].get('model')})")
    ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.12), ncol=2, frameon=False)
    ax.margins(y=0.15)
    return _save(fig, path)


def render_all(results: Results, out_dir: str | Path, *, utilization: float = 1.0) -> list[Path]:
    """Every chart the results support; returns the files written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: list[Path | None] = []
    if results.measurements:
        written += [
            throughput(results, out / "throughput.png"),
            mtp_effect(results, out / "mtp-effect.png"),
            platform(results, out / "platform.png"),
            cost_chart(results, out / "cost.png", utilization=utilization),
            harness_vs_server(results, out / "harness-vs-server.png"),
        ]
    written.append(concurrency(results, out / "concurrency.png"))
    return [p for p in written if p is not None]


def capacity_chart(doc: dict, path: Path, *, knee: int | None = None) -> Path | None:
    """The capacity curve: aggregate and per-stream tok/s (left) and ¥/M output tokens (right) against streams."""
    steps = [s for s in doc["steps"] if s["summary"]]
    if not steps:
        return None
    streams = [s["streams"] for s in steps]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    ax.plot(streams, [s["summary"]["aggregate_tok_s"] for s in steps], "o-", color=OFF_COLOR, label="aggregate tok/s")
    ax.plot(streams, [s["summary"]["per_stream_tok_s"] for s in steps], "s--", color="#55A868",
            label="per-stream tok/s")  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xticks(streams, [str(n) for n in streams])
    ax.set_xlabel("concurrent streams")
    ax.set_ylabel("tok/s")
    ax.set_ylim(bottom=0)
    handles, labels = ax.get_legend_handles_labels()
    priced = [s for s in steps if s["summary"].get("cny_per_million") is not None]
    if priced:
        right = ax.twinx()
        right.plot([s["streams"] for s in priced], [s["summary"]["cny_per_million"] for s in priced], "d-",
                   color=ON_COLOR, label=f"¥/M output tokens ({doc['price']['instance_type']})")  # fmt: skip
        right.set_ylabel("CNY per million output tokens")
        right.set_ylim(bottom=0)
        h, lab = right.get_legend_handles_labels()
        handles, labels = handles + h, labels + lab
    if knee is not None:
        ax.axvline(knee, color="#C44E52", linestyle=":", linewidth=1.5)
        handles.append(ax.lines[-1])
        labels.append(f"knee: {knee} stream{'' if knee == 1 else 's'}")
    ax.legend(handles, labels, fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
    ax.set_title(f"Capacity: {doc['model']} on {doc['hardware']}, max_tokens {doc['method']['max_tokens']}",
                 fontsize=10)  # fmt: skip
    return _save(fig, path)
