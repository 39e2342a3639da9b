"""The consumer-GPU guide's own verification (seeds/003, section 5): its two prompts, tokens/s and MTP acceptance.

The guide claims 63.7 -> 105.4 tok/s for Qwen3.6-27B with MTP on one consumer card and about 80% draft
acceptance. `gguf-serve-bench smoke` sends the same two prompts with the guide's max_new_tokens (128, 256) and
prints llama-server's own decode speed and acceptance (its per-request `timings`) beside that claim.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

# (name, prompt, max_new_tokens) exactly as the guide's 功能验证 block
PROMPTS = (
    ("quantum-computing", "解释量子计算的基本原理", 128),
    ("quicksort", "用Python实现快速排序算法", 256),
)
GUIDE_CLAIM = {"mtp_off_tok_s": 63.7, "mtp_on_tok_s": 105.4, "draft_acceptance": 0.80, "model": "Qwen3.6-27B"}
SCHEMA = "gguf-serve-smoke/1"  # `bench smoke --out`; `bench report` reads it beside benchmark results


@dataclass(frozen=True)
class SmokeResult:
    prompt: str
    completion_tokens: int
    decode_tok_s: float | None  # llama-server's predicted_per_second
    wall_tok_s: float  # completion tokens / request wall time (includes the prompt)
    draft_n: int | None
    draft_accepted: int | None
    answer_head: str

    @property
    def acceptance(self) -> float | None:
        return self.draft_accepted / self.draft_n if self.draft_n else None


def run_smoke(client: Any, model: str, *, temperature: float = 0.7) -> list[SmokeResult]:
    out = []
    for name, prompt, max_tokens in PROMPTS:
        start = time.monotonic()
        reply = client.chat.completions.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=temperature,  # the guide's pipeline: do_sample=True, temperature=0.7
        )
        wall = time.monotonic() - start
        timings = (reply.model_extra or {}).get("timings") or {}
        tokens = reply.usage.completion_tokens if reply.usage else int(timings.get("predicted_n", 0))
        out.append(
            SmokeResult(
                prompt=name,
                completion_tokens=tokens,
                decode_tok_s=timings.get("predicted_per_second"),
                wall_tok_s=tokens / wall if wall > 0 else 0.0,
                draft_n=timings.get("draft_n"),
                draft_accepted=timings.get("draft_n_accepted"),
                answer_head=_cell(reply.choices[0].message.content or "")[:60],
            )
        )
    return out


def _cell(text: str) -> str:
    """Text fit for one Markdown table cell."""
    return text.strip().replace("\n", " ").replace("|", "\\|")


def report(results: list[SmokeResult], *, label: str) -> str:
    return "\n".join([*_per_prompt(results), "", *comparison([(label, results)])])


def _per_prompt(results: list[SmokeResult]) -> list[str]:
    lines = [
        "| prompt | tokens | decode tok/s | wall tok/s | draft acceptance | answer starts |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        acc = f"{100 * r.acceptance:.1f}% ({r.draft_accepted}/{r.draft_n})" if r.acceptance is not None else "MTP off"
        tps = f"{r.decode_tok_s:.1f}" if r.decode_tok_s else "n/a"
        lines.append(f"| {r.prompt} | {r.completion_tokens} | {tps} | {r.wall_tok_s:.1f} | {acc} | {r.answer_head} |")
    return lines


def comparison(runs: list[tuple[str, list[SmokeResult]]]) -> list[str]:
    """The guide's claim and each run's mean decode speed and overall draft acceptance, one row each."""
    g = GUIDE_CLAIM
    lines = [
        "| | decode tok/s | draft acceptance |",
        "|---|---|---|",
        f"| guide's claim, {g['model']} MTP off -> on | {g['mtp_off_tok_s']} -> {g['mtp_on_tok_s']} | "
        f"{100 * g['draft_acceptance']:.0f}% |",
    ]
    for label, results in runs:
        speeds = [r.decode_tok_s for r in results if r.decode_tok_s]
        mean = sum(speeds) / len(speeds) if speeds else None
        drafted = sum(r.draft_n or 0 for r in results)
        accepted = sum(r.draft_accepted or 0 for r in results)
        lines.append(
            f"| {label} | {f'{mean:.1f}' if mean else 'n/a'} | "
            f"{f'{100 * accepted / drafted:.1f}%' if drafted else 'MTP off'} |"
        )
    return lines


def from_json(doc: Any, where: str) -> tuple[str, list[SmokeResult]]:
    """A `bench smoke --out` file: its label (with the model) and results; ValueError naming the file otherwise."""
    try:
        rows = [{k: v for k, v in r.items() if k != "acceptance"} for r in doc["results"]]
        return f"{doc['label']} ({doc['model']})", [SmokeResult(**r) for r in rows]
    except (KeyError, TypeError, AttributeError) as e:
        raise ValueError(f"{where}: not a valid smoke results file ({type(e).__name__}: {e})") from None


def to_json(results: list[SmokeResult], *, label: str, endpoint_model: str) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "label": label,
        "model": endpoint_model,
        "guide_claim": GUIDE_CLAIM,
        "results": [{**asdict(r), "acceptance": r.acceptance} for r in results],
    }
