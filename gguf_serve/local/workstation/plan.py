"""`gguf-serve-workstation check`: what fits each card, computed by the catalog, printed."""

from __future__ import annotations

from dataclasses import replace

from gguf_serve.catalog.loader import Catalog
from gguf_serve.catalog.memory import fit_on, smallest_fit, suggest_card
from gguf_serve.container.server import ALL_LAYERS, ServerSettings, Speculative


def matrix_settings(mtp: bool) -> ServerSettings:
    """The settings the card table is computed with: one slot of 32k context, MTP as the file allows."""
    return ServerSettings(
        ctx_per_slot=32768, parallel=1, gpu_layers=ALL_LAYERS, speculative=Speculative() if mtp else None
    )


def card_table(catalog: Catalog, models: list[str]) -> list[str]:
    """One line per card x model: the flag that makes it fit, GPU and host memory, or the refusal's advice."""
    cards = catalog.workstations
    lines = [
        "| card | model | fits with | GPU GiB (need / card) | host RAM GiB (need / box) |",
        "|---|---|---|---|---|",
    ]
    for name, hw in sorted(cards.items(), key=lambda kv: kv[1].gpu_memory_gib):
        for model_name in models:
            m = catalog.models[model_name]
            server = replace(matrix_settings(m.has_mtp_layers), cache_ram_mib=1024 if hw.memory_gib < 20 else 4096)
            fit = smallest_fit(m, server, hw) if m.expert_bytes_per_layer else fit_on(m, server, hw)
            how = fit.flag if fit.fits else f"does not fit: {suggest_card(m, server, cards, but=name)}"
            lines.append(
                f"| {name} ({round(hw.gpu_memory_gib)} GB) | {model_name} | {how} | "
                f"{fit.gpu_need_gib:.1f} / {fit.gpu_gib:.1f} | {fit.host_need_gib:.1f} / {fit.host_gib:.1f} |"
            )
    return lines


def profile_lines(catalog: Catalog) -> list[str]:
    from gguf_serve.catalog.memory import fit_on as fit

    out = []
    for p in catalog.workstation_profiles.values():
        f = fit(p.model, p.server, p.hardware)
        s = p.server
        out.append(
            f"{p.name}: {p.hardware.instance_type} ({p.hardware.gpu}) + {p.model.name}, MTP "
            f"{'on' if p.mtp else 'off'}, {s.parallel} x {s.ctx_per_slot} ctx, {p.threads} threads, {f.flag}"
        )
        out.append(
            f"  GPU {f.gpu_need_gib:.1f} of {f.gpu_gib:.1f} GiB; host RAM {f.host_need_gib:.1f} of {f.host_gib:.1f} "
            f"GiB (prompt cache {s.cache_ram_mib} MiB){'' if p.model.sha256 else '; model NOT PINNED (no sha256)'}"
        )
    return out
