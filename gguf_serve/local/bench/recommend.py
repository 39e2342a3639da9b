"""The report's decision tree (7.1), driven by the profile catalog and a set of measured figures.

Q1 GPU quota?  yes -> the fastest GPU profile.
Q2 cost first? yes -> the CPU profile with the lowest yuan per million output tokens.
               no  -> the same model on the next larger instance of that CPU family (more concurrency headroom).
With the field report's figures this gives GpuMtpStack, GravitonMoeStack and GravitonMoeHeadroomStack (c8g.8xlarge
+ MoE, profiles/serving/graviton-moe-headroom.toml; its speed and price are the report's estimates).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from gguf_serve.catalog import ServingProfile
from gguf_serve.local.bench import cost
from gguf_serve.local.bench.results import Results

PRIORITIES = ("cost", "headroom")


@dataclass(frozen=True)
class Recommendation:
    path: list[tuple[str, str]]  # (question, answer) as walked
    instance_type: str
    model: str
    moe: bool
    mtp: bool
    stack: str | None  # None: no stack deploys this configuration yet
    deploy: str  # `npx cdk deploy <Stack>`: the stack itself, or the closest one when stack is None
    tok_s_low: float
    tok_s_high: float
    tok_s_source: str
    costs: list[cost.Cost] = field(default_factory=list)  # RI cost at tok_s_low (and tok_s_high when they differ)
    notes: list[str] = field(default_factory=list)


def deploy_line(stack: str) -> str:
    return f"npx cdk deploy {stack}"


def _measured(figures: Results, p: ServingProfile) -> float | None:
    m = figures.find(instance_type=p.hardware.instance_type, model=p.model.name, mtp=p.mtp)
    return m.effective_tok_s if m else None


def _ri_per_million(figures: Results, p: ServingProfile, utilization: float) -> float:
    tok_s = _measured(figures, p)
    if tok_s is None or p.hardware.ri_1yr_all_upfront_cny is None:
        return float("inf")
    return cost.ri_cost(p.hardware.instance_type, tok_s, utilization, hardware=figures.catalog.hardware).cny_per_million


def _for_profile(
    path: list[tuple[str, str]], p: ServingProfile, figures: Results, utilization: float, source: str
) -> Recommendation:
    tok_s = _measured(figures, p)
    if tok_s is None:
        raise ValueError(f"the figures have no measurement for profile {p.name!r}; run `gguf-serve-bench run` on it")
    return Recommendation(
        path=path,
        instance_type=p.hardware.instance_type,
        model=p.model.name,
        moe=p.model.is_moe,
        mtp=p.mtp,
        stack=p.stack_name,
        deploy=deploy_line(p.stack_name),
        tok_s_low=tok_s,
        tok_s_high=tok_s,
        tok_s_source=source,
        costs=[cost.ri_cost(p.hardware.instance_type, tok_s, utilization, hardware=figures.catalog.hardware)],
    )


def _larger_sibling(p: ServingProfile, figures: Results) -> str | None:
    """The next larger instance of the same CPU family in the catalog (c8g.4xlarge -> c8g.8xlarge)."""
    family = p.hardware.instance_type.split(".")[0]
    bigger = [
        hw
        for hw in figures.catalog.hardware.values()
        if hw.instance_type.split(".")[0] == family and hw.cpu == p.hardware.cpu and hw.vcpus > p.hardware.vcpus
    ]
    return min(bigger, key=lambda hw: hw.vcpus).instance_type if bigger else None


def recommend(
    *, gpu_quota: bool, priority: str, figures: Results, utilization: float = 1.0, source: str = "field report"
) -> Recommendation:
    if priority not in PRIORITIES:
        raise ValueError(f"priority must be one of {PRIORITIES}")
    profiles = figures.catalog.profiles.values()
    gpu = [p for p in profiles if p.hardware.has_gpu and _measured(figures, p)]
    cpu = [p for p in profiles if not p.hardware.has_gpu and _measured(figures, p)]
    if gpu_quota and gpu:
        best = max(gpu, key=lambda p: _measured(figures, p) or 0.0)
        return _for_profile([("GPU quota?", "yes")], best, figures, utilization, f"{source}, measured")
    if not cpu:
        raise ValueError("the figures measure no CPU profile of the catalog")
    path = [("GPU quota?", "no" if not gpu_quota else "yes, but no GPU profile is measured")]
    cheapest = min(cpu, key=lambda p: _ri_per_million(figures, p, utilization))
    if priority == "cost":
        path.append(("Cost first?", "yes"))
        return _for_profile(path, cheapest, figures, utilization, f"{source}, measured")
    path.append(("Cost first?", "no: more concurrency headroom"))
    return _headroom(path, cheapest, figures, utilization, source)


def _headroom(
    path: list[tuple[str, str]], base: ServingProfile, figures: Results, utilization: float, source: str
) -> Recommendation:
    target = _larger_sibling(base, figures)
    if target is None:
        raise ValueError(f"the catalog has no larger instance than {base.hardware.instance_type} in its family")
    model, mtp = base.model.name, base.mtp
    stack = next(
        (
            p.stack_name
            for p in figures.catalog.profiles.values()
            if (p.hardware.instance_type, p.model.name, p.mtp) == (target, model, mtp)
        ),
        None,
    )
    measured = figures.find(instance_type=target, model=model, mtp=mtp)
    estimate = figures.estimate(instance_type=target, model=model, mtp=mtp)
    if measured:
        low = high = measured.effective_tok_s
        tok_source = f"{source}, measured"
    elif estimate:
        low, high = estimate.tok_s_low, estimate.tok_s_high
        tok_source = f"{source}: {estimate.note}"
    else:
        raise ValueError(f"the figures have neither a measurement nor an estimate for {target} + {model}")
    hardware = figures.catalog.hardware
    costs = [cost.ri_cost(target, low, utilization, hardware=hardware)]
    if high != low:
        costs.append(cost.ri_cost(target, high, utilization, hardware=hardware))
    notes = []
    if stack is None:
        notes += [
            f"No stack deploys {target} yet. The closest is {base.stack_name} ({base.hardware.instance_type}, same "
            f"model and settings): deploy it and raise the fleet's max capacity (now "
            f"{base.fleet.capacity.max_capacity}) for headroom.",
            f'To get {target}: add profiles/serving/<name>.toml with stack = "<Name>Stack", instance_type = '
            f'"{target}", model = "{model}" (README: "Adding a profile"), then `npx cdk deploy <Name>Stack`.',
        ]
    base_cost = _for_profile([], base, figures, utilization, source).costs[0]
    instances = costs[0].monthly_cny / base_cost.monthly_cny
    notes.append(
        f"Compare: the same monthly cost buys {instances:.1f} x {base.hardware.instance_type} ({base.stack_name}), "
        f"{base_cost.tok_s:.2f} tok/s each at {cost.money(base_cost.cny_per_million, unit='¥')} per million tokens."
    )
    return Recommendation(
        path=path,
        instance_type=target,
        model=model,
        moe=base.model.is_moe,
        mtp=mtp,
        stack=stack,
        deploy=deploy_line(stack or base.stack_name),
        tok_s_low=low,
        tok_s_high=high,
        tok_s_source=tok_source,
        costs=costs,
        notes=notes,
    )


def render(r: Recommendation) -> str:
    lines = [f"{q} {a}" for q, a in r.path]
    kind = "MoE" if r.moe else "Dense"
    lines.append(
        f"-> {r.stack or '(no stack yet)'}: {r.instance_type} + {r.model} ({kind}), MTP {'on' if r.mtp else 'off'}"
    )
    approx = "~" if r.tok_s_low != r.tok_s_high else ""
    tok = f"{r.tok_s_low:.2f}" if not approx else f"{r.tok_s_low:g}-{r.tok_s_high:g}"
    lines.append(f"   expected: {approx}{tok} tok/s, one request at a time ({r.tok_s_source})")
    c0 = r.costs[0]
    est = c0.estimate
    yearly = cost.money(c0.yearly_cny or 0, decimals=0, estimate=est, unit="¥")
    lines.append(
        f"   monthly: {cost.money(c0.monthly_cny, estimate=est, unit='¥')} "
        f"(1-year RI all upfront {yearly} / 12{', the catalog price is an estimate' if est else ''})"
    )
    per_m = sorted(c.cny_per_million for c in r.costs)
    per_m_text = " to ".join(cost.money(v, unit="¥") for v in per_m)
    lines.append(
        f"   {'~' if approx or est else ''}{per_m_text} per million output tokens at {c0.utilization:.0%} utilization"
    )
    lines += [f"   {n}" for n in r.notes]
    label = "deploy" if r.stack else "closest deploy"
    lines.append(f"{label}: {r.deploy}")
    return "\n".join(lines)


def render_tree(figures: Results, utilization: float = 1.0) -> str:
    """Every branch of the tree, for `recommend` without answers."""
    out = []
    for gpu_quota, priority, flags in (
        (True, "cost", "--gpu-quota"),
        (False, "cost", "--no-gpu-quota --priority cost"),
        (False, "headroom", "--no-gpu-quota --priority headroom"),
    ):
        r = recommend(gpu_quota=gpu_quota, priority=priority, figures=figures, utilization=utilization)
        out.append(f"## gguf-serve-bench recommend {flags}\n{render(r)}")
    return "\n\n".join(out)
