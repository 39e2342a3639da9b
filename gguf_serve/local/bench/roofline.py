"""The roofline in numbers: bytes a decode step reads, and the memory bandwidth a measured tok/s implies.

llama.cpp's decode reads every weight a token needs once per step (a batch of streams shares that read) plus,
per stream, the KV cache of its context and its recurrent state. For a MoE only the routed experts are read:
`expert_used_count` of `expert_count` per block, so a step of N streams reads the union of their experts, which
under uniform routing is a (1 - (1 - k/E)^N) share (real routing is skewed: fewer distinct experts, so this is
an upper bound). MTP layers (the `nextn` blocks) run only with speculative decoding; with it, one pass of the
main model verifies the drafts and yields accepted + 1 tokens, so passes per token = (predicted_n - accepted) /
predicted_n (the server's timings).
Weights come from the GGUF's tensor table when the file is at hand (`--gguf`: exact), else from the model lock:
the file's size less the experts not routed (estimated per block where the lock has no tensor table); that
count keeps the token embedding, of which one row is read per token, so it is an upper bound for an untied
model. KV cache is f16 over the full-attention layers (gguf_serve.catalog.model_facts, sliding windows at full
context: also an upper bound).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gguf_serve.catalog import ModelArtifact, model_facts
from gguf_serve.catalog.lockfile import LockedModel

GB = 1e9  # bandwidth in decimal GB/s, as memory datasheets and STREAM print it


@dataclass(frozen=True)
class ModelBytes:
    """What one decode step of one stream reads, split where batching shares it and where it does not."""

    model: str
    shared_bytes: int  # dense weights every step reads once, whatever the batch
    expert_bytes: int  # all routed-expert weights of the blocks that run (0 for a dense model)
    experts_used: int  # k of E experts per token (0, 0 for a dense model)
    experts_total: int
    kv_bytes_per_token: int  # per stream, per token of context
    state_bytes: int  # per stream: recurrent state, read every token
    basis: str  # where the numbers come from, in one line

    def weights_per_step(self, streams: int = 1) -> float:
        """Weight bytes one step of `streams` tokens reads: the experts' union under uniform routing."""
        if not self.experts_total:
            return float(self.shared_bytes)
        share = 1 - (1 - self.experts_used / self.experts_total) ** max(streams, 1)
        return self.shared_bytes + self.expert_bytes * share

    def per_token(self, *, depth: float, streams: int = 1, passes_per_token: float = 1.0) -> float:
        """Bytes read per generated token at a mean context `depth`, `streams` decoding together."""
        per_stream = self.kv_bytes_per_token * depth + self.state_bytes
        return (self.weights_per_step(streams) / max(streams, 1) + per_stream) * passes_per_token


def from_lock(model: ModelArtifact, lock: LockedModel | None, *, mtp: bool) -> ModelBytes:
    """The model's bytes per step from its lock (header facts and, where locked from a listing, expert bytes)."""
    facts = lock.header if lock else {}
    blocks = facts.get("block_count", 0)
    trunk = model_facts.trunk_layers(facts, model.name) if blocks else 0
    run = blocks if mtp else trunk
    per_block = list(model.expert_bytes_per_layer)
    experts = sum(per_block[:run])
    skipped = sum(per_block[run:])  # the MTP block's experts when MTP is off
    total = facts.get("expert_count", 0) if per_block else 0
    used = facts.get("expert_used_count", 0) if total else 0
    exact = bool(lock and lock.tensors.get("expert_bytes"))
    where = "the lock's tensor table" if exact else "estimated from the header (model_facts.estimated_expert_bytes)"
    basis = (
        f"{model.name}: file {model.size_bytes:,} bytes"
        + (f" less experts not routed ({used} of {total} per block; expert bytes {where})" if total else "")
        + (", less the MTP block's experts (its attention counted)" if skipped else "")
        + ("; the MTP block counted" if blocks > trunk and not skipped and not mtp else "")
        + "; the token embedding counted (one row is read per token: an upper bound unless tied)"
    )
    return ModelBytes(
        model=model.name,
        shared_bytes=model.size_bytes - experts - skipped,
        expert_bytes=experts if total else 0,
        experts_used=used,
        experts_total=total,
        kv_bytes_per_token=model.kv_bytes_per_token,
        state_bytes=model.recurrent_state_bytes_per_slot,
        basis=basis,
    )


def from_gguf(path: Path, model: ModelArtifact, *, mtp: bool) -> ModelBytes:
    """The model's bytes per step from the file's own tensor table: each tensor a step reads, at its ggml size."""
    from gguf_serve.catalog.lock import read_tensor_infos
    from gguf_serve.container.fetch.gguf import read_metadata_from

    with path.open("rb") as f:
        meta = read_metadata_from(f, size=path.stat().st_size, label=str(path))
        tensors = read_tensor_infos(f, meta["GGUF.tensor_count"], label=str(path))
    facts = model_facts.header_facts(meta)
    trunk = model_facts.trunk_layers(facts, str(path))
    names = {name for name, _ in tensors}
    shared = experts = 0
    for name, size in tensors:
        block = model_facts.EXPERT_TENSOR.search(name)
        layer = _block(name)
        if layer is not None and layer >= trunk and not mtp:
            continue  # an MTP (nextn) block: only the draft runs it
        if name == "token_embd.weight" and "output.weight" in names:
            continue  # untied: the input embedding is a lookup of one row per token
        if block:
            experts += size
        else:
            shared += size
    total = facts.get("expert_count", 0) if experts else 0
    return ModelBytes(
        model=model.name,
        shared_bytes=shared,
        expert_bytes=experts,
        experts_used=facts.get("expert_used_count", 0) if total else 0,
        experts_total=total,
        kv_bytes_per_token=model_facts.kv_bytes_per_token(facts, str(path)),
        state_bytes=model_facts.recurrent_state_bytes(facts, str(path)),
        basis=f"{model.name}: the tensor table of {path.name} ({len(tensors)} tensors"
        + (", the MTP block left out" if not mtp and trunk < facts["block_count"] else "")
        + (", the input embedding left out: untied" if "output.weight" in names else ", tied embedding: read whole")
        + ")",
    )


def _block(name: str) -> int | None:
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


def passes_per_token(timings: list[dict[str, Any]]) -> float:
    """Main-model passes per generated token from the server's timings: 1 without speculative decoding."""
    predicted = sum(float(t.get("predicted_n", 0)) for t in timings)
    accepted = sum(float(t.get("draft_n_accepted", 0)) for t in timings)
    return (predicted - accepted) / predicted if predicted else 1.0


def mean_depth(runs: list[dict[str, Any]]) -> float:
    """Mean context length over the generated tokens: the prompt plus half the completion."""
    depths = [float(r.get("prompt_tokens") or 0) + float(r["completion_tokens"]) / 2 for r in runs]
    return sum(depths) / len(depths) if depths else 0.0


@dataclass(frozen=True)
class Roofline:
    bytes_per_token: float
    tok_s: float
    implied_gb_s: float
    depth: float
    streams: int
    passes_per_token: float
    basis: str
    peak_gb_s: float | None = None  # the probe's (gguf-serve-bench bandwidth) on the serving host
    efficiency: float | None = None  # implied / peak

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def roofline(
    mb: ModelBytes, *, tok_s: float, depth: float, streams: int = 1, passes: float = 1.0, peak_gb_s: float | None = None
) -> Roofline:
    per_token = mb.per_token(depth=depth, streams=streams, passes_per_token=passes)
    implied = per_token * tok_s / GB
    return Roofline(
        bytes_per_token=per_token,
        tok_s=tok_s,
        implied_gb_s=implied,
        depth=depth,
        streams=streams,
        passes_per_token=passes,
        basis=mb.basis,
        peak_gb_s=peak_gb_s,
        efficiency=implied / peak_gb_s if peak_gb_s else None,
    )


def line(r: Roofline) -> str:
    """One line for a person: bytes per token, the bandwidth it implies, and against the probe where there is one."""
    text = (
        f"roofline: {r.bytes_per_token / GB:.3f} GB read per token (depth {r.depth:.0f}"
        + (f", {r.streams} streams" if r.streams > 1 else "")
        + (f", {r.passes_per_token:.2f} passes/token" if r.passes_per_token != 1 else "")
        + f") x {r.tok_s:.2f} tok/s = {r.implied_gb_s:.1f} GB/s"
    )
    if r.efficiency is not None:
        text += f", {r.efficiency:.0%} of the {r.peak_gb_s:.1f} GB/s the probe read"
    return text


def model_bytes(catalog: Any, model_name: str, *, gguf: Path | None, mtp: bool) -> ModelBytes | None:
    """From the served file's tensor table when given (exact), else from the catalog's lock; None if unknown."""
    model = catalog.models.get(model_name)
    if model is None:
        return None
    return from_gguf(gguf, model, mtp=mtp) if gguf else from_lock(model, catalog.locks.get(model_name), mtp=mtp)


def for_run(
    kind: str, summary: dict[str, Any], rows: list[dict[str, Any]], mb: ModelBytes, *, peak_gb_s: float | None
) -> Roofline:
    """A results document's roofline: decode rate (the server's own, where it reports one) over its requests."""
    ok = [r for r in rows if not r["warmup"] and "error" not in r]
    timings = [r["timings"] for r in ok if r.get("timings")]
    if kind == "concurrency":
        tok_s, streams = summary["aggregate_tok_s"], summary["concurrency"]
    else:
        tok_s, streams = summary.get("predicted_per_second") or summary["effective_tok_s"], 1
    return roofline(
        mb, tok_s=tok_s, depth=mean_depth(ok), streams=streams, passes=passes_per_token(timings), peak_gb_s=peak_gb_s
    )


def figures_table(figures: Any, catalog: Any, *, every: bool = False) -> str:
    """Each instance's best configuration (the report's three figures by default; every: all measurements) as
    bytes per token and the GB/s its tok/s implies.

    Depth: the row's total time x tok/s less the answer (the prompt, as docs/benchmark.md reads the report's
    count) plus half the answer. MTP: one pass per 1 + draft_n_max x acceptance tokens (every pass drafting the
    profile's draft_n_max, the report's 2).
    """
    from gguf_serve.local.bench.method import MAX_TOKENS
    from gguf_serve.local.bench.tables import best_per_instance, markdown, on_off

    rows = []
    for m in figures.measurements if every else best_per_instance(figures):
        mb = model_bytes(catalog, m.model, gguf=None, mtp=m.mtp)
        if mb is None:
            continue
        passes = 1.0
        if m.mtp and m.draft_acceptance:
            passes = 1 / (1 + _draft_n_max(catalog, m.instance_type) * m.draft_acceptance)
        prompt = max(m.total_time_s * m.effective_tok_s - MAX_TOKENS, 0.0)
        r = roofline(mb, tok_s=m.effective_tok_s, depth=prompt + MAX_TOKENS / 2, passes=passes)
        weights = mb.weights_per_step() * passes
        rows.append([
            m.instance_type,
            f"{m.model}, MTP {on_off(m.mtp)}",
            f"{m.effective_tok_s:.2f}",
            f"{weights / GB:.3f}",
            f"{(r.bytes_per_token - weights) / GB:.3f}",
            f"{passes:.3f}",
            f"{r.bytes_per_token / GB:.3f}",
            f"{r.implied_gb_s:.1f}",
        ])  # fmt: skip
    header = ["Instance", "Configuration", "tok/s", "Weights GB/token", "KV + state GB/token", "Passes/token",
              "GB/token", "Implied GB/s"]  # fmt: skip
    return markdown(header, rows)


def _draft_n_max(catalog: Any, instance_type: str) -> int:
    specs = sorted(
        (p.hardware.instance_type != instance_type, p.server.speculative.draft_n_max)
        for p in catalog.profiles.values()
        if p.server.speculative is not None
    )
    if not specs:
        raise ValueError("no MTP profile in the catalog says how many tokens a pass drafts (draft_n_max)")
    return specs[0][1]
