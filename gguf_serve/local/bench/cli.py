"""The field report's benchmark, tables, cost model and decision tree: gguf-serve-bench run|report|cost|recommend,
and its capacity curve and roofline: capacity|roofline|bandwidth."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from dataclasses import asdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gguf_serve.catalog import load_catalog
from gguf_serve.local.bench import capacity_cli, cost, method, recommend, results, roofline, runner, tables
from gguf_serve.local.bench.endpoint import make_client, resolve_api_key, served_model
from gguf_serve.local.bench.target import DEFAULT_ENDPOINT, add_target, connect

RESULTS_DIR = Path("results/local")


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _loadavg() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1")
    return value


def _non_negative(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError("must be at least 0")
    return value


def _utilization(text: str) -> float:
    value = float(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError("must be in (0, 1], e.g. 0.5 for half the time busy")
    return value


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gguf-serve-bench", description=__doc__)
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="benchmark an OpenAI-compatible llama-server endpoint with the report's method")
    add_target(run)
    run.add_argument(
        "--max-tokens", type=_positive, default=method.MAX_TOKENS, help=f"default {method.MAX_TOKENS}, the report's"
    )
    run.add_argument(
        "--repetitions",
        type=_positive,
        default=method.REPETITIONS,
        help="measured requests (per client with --concurrency)",
    )
    run.add_argument("--warmup", type=_non_negative, default=method.WARMUP, help="unmeasured requests first")
    run.add_argument(
        "--concurrency",
        type=_positive,
        help="N parallel streaming clients (TTFT, ITL, percentiles); default: one request at a time",
    )
    run.add_argument("-o", "--output", type=Path, help=f"results JSON (default {RESULTS_DIR}/<profile>-<time>.json)")
    capacity_cli.add_roofline_options(run)
    capacity_cli.add_parser(sub)

    rep = sub.add_parser("report", help="the report's tables (Markdown) and charts (PNG) from results files")
    rep.add_argument("files", nargs="*", type=Path, help="results files (default: the field report's figures)")
    rep.add_argument("--charts", type=Path, metavar="DIR", help="write PNG charts to DIR")
    rep.add_argument("-o", "--output", type=Path, help="write the Markdown to a file instead of stdout")
    rep.add_argument("--utilization", type=_utilization, default=1.0)

    cst = sub.add_parser("cost", help="yuan per million output tokens (the report's section 8)")
    cst.add_argument("files", nargs="*", type=Path, help="results files (default: the field report's figures)")
    cst.add_argument("--instance", help="instance type, with --tok-s, instead of results files")
    cst.add_argument("--tok-s", type=float, help="output tokens per second, with --instance")
    cst.add_argument("--utilization", type=_utilization, default=1.0, help="busy fraction, 0-1 (default 1.0)")
    cst.add_argument("--json", action="store_true", help="machine-readable output")

    smk = sub.add_parser("smoke", help="the consumer-GPU guide's two verification prompts: tok/s and MTP acceptance")
    smk.add_argument("--endpoint", default=DEFAULT_ENDPOINT, help=f"base URL (default {DEFAULT_ENDPOINT})")
    smk.add_argument("--api-key", help="API key (default: LLAMA_API_KEY)")
    smk.add_argument("--model", help="model id (default: the first one the endpoint lists)")
    smk.add_argument("--label", default="this run", help="name of this machine in the comparison row")
    smk.add_argument("--out", type=Path, help="also write the results as JSON here")

    rec = sub.add_parser("recommend", help="the report's decision tree: which stack to deploy")
    rec.add_argument(
        "--gpu-quota",
        action=argparse.BooleanOptionalAction,
        help="do you have G5 quota in the region? (omit both to print every branch)",
    )
    rec.add_argument(
        "--priority",
        choices=recommend.PRIORITIES,
        default="cost",
        help="cost: lowest ¥/M tokens; headroom: more concurrency per instance",
    )
    rec.add_argument(
        "--figures",
        nargs="*",
        type=Path,
        default=[],
        help="results files to decide from (default: the field report's figures)",
    )
    rec.add_argument("--utilization", type=_utilization, default=1.0)
    rec.add_argument("--json", action="store_true")
    return p


def cmd_run(a: argparse.Namespace) -> int:
    """Measure, writing the results file after every request; an unfinished file with the same method resumes."""
    from openai import __version__ as openai_version

    log = runner.stderr_log
    catalog = load_catalog()
    label, client, served = connect(a, catalog, log)
    desc = method.describe(
        max_tokens=a.max_tokens, repetitions=a.repetitions, warmup=a.warmup, concurrency=a.concurrency
    )
    kind = "sequential" if a.concurrency is None else "concurrency"
    started = _now()
    out = a.output or RESULTS_DIR / f"{a.profile}-{started.replace(':', '').replace('+0000', 'Z')}.json"
    model = label.model or served
    doc: dict[str, Any] = {
        "schema": results.SCHEMA,
        "kind": kind,
        "profile": a.profile,
        "instance_type": label.instance_type,
        "hardware": label.hardware,
        "model": model,
        "moe": results.is_moe(model, catalog),
        "mtp": bool(label.mtp),
        "served_model": served,
        "endpoint": a.endpoint,
        "started_at": started,
        "finished_at": None,
        "complete": False,
        "method": desc,
        "harness": {
            "python": platform.python_version(),
            "openai": openai_version,
            # 1-minute load average of the client machine: on a shared or local host, contention shows here.
            "client_loadavg_1m": [_loadavg(), None],
            "client_cpus": os.cpu_count(),
        },
        "runs": [],
        "summary": None,
    }
    doc["runs"] = _resumable_rows(out, doc, log)
    created = not out.exists()
    _save(doc, out)  # before the first request: an unwritable -o fails now, not after half an hour
    doc["bandwidth"] = capacity_cli.probe(a, log)  # before any request loads the server
    try:
        return _measure(a, client, served, doc, out, log, label.mtp)
    except Exception:
        if created and not doc["runs"]:
            out.unlink(missing_ok=True)  # refused at the first request: leave no empty results file behind
        raise


def _measure(
    a: argparse.Namespace, client: Any, served: str, doc: dict[str, Any], out: Path, log: runner.Log,
    label_mtp: bool | None,
) -> int:  # fmt: skip
    kind = doc["kind"]

    def keep(row: dict[str, Any]) -> None:
        doc["runs"].append(row)
        _save(doc, out)

    done = sum(runner.measured(r) for r in doc["runs"])
    mode = "one request at a time" if a.concurrency is None else f"{a.concurrency} streaming clients"
    log(
        f"benchmarking {served} at {a.endpoint} ({a.profile}): {mode}, max_tokens {a.max_tokens}, "
        f"{a.warmup} warm-up + {a.repetitions - done} measured" + (f" ({done} kept from {out})" if done else "")
    )
    if a.concurrency is None:
        runner.run_sequential(
            client, served, repetitions=a.repetitions - done, warmup=a.warmup, max_tokens=a.max_tokens, log=log,
            on_row=keep, first_index=len(doc["runs"]),
        )  # fmt: skip
        rows = doc["runs"]
        valid = sum(runner.measured(r) for r in rows)
        summary = runner.summarize_sequential(rows) if valid else None
        observed_mtp = summary.get("speculative") if summary else None
        complete = valid >= a.repetitions
    else:
        rows, wall = runner.run_concurrent(
            client, served, concurrency=a.concurrency, repetitions=a.repetitions, warmup=a.warmup,
            max_tokens=a.max_tokens, log=log, on_row=keep,
        )  # fmt: skip
        doc["runs"] = rows  # by client, as the phase ran (they were saved in the order they finished)
        valid = sum(runner.measured(r) for r in rows)
        summary = runner.summarize_concurrent(rows, wall, a.concurrency) if valid else None
        observed_mtp = any("draft_n" in r.get("timings", {}) for r in rows if runner.measured(r)) if valid else None
        complete = valid > 0  # under load a failed request is a result; a phase with none valid measured nothing
    mtp = label_mtp if observed_mtp is None else bool(observed_mtp)
    if label_mtp is not None and observed_mtp is not None and label_mtp != observed_mtp:
        log(
            f"warning: profile {a.profile!r} expects MTP {'on' if label_mtp else 'off'} but the server's timings "
            f"say {'on' if observed_mtp else 'off'}; recording what the server did"
        )
    doc.update(mtp=bool(mtp), summary=summary, complete=complete, finished_at=_now())
    doc["harness"]["client_loadavg_1m"][1] = _loadavg()
    mb = roofline.model_bytes(load_catalog(), doc["model"], gguf=a.gguf, mtp=doc["mtp"]) if summary else None
    if mb is not None:
        peak = doc["bandwidth"]["gb_s"] if doc.get("bandwidth") else None
        roof = roofline.for_run(kind, summary, doc["runs"], mb, peak_gb_s=peak)
        doc["roofline"] = roof.to_json()
    _save(doc, out)
    if summary is not None:
        log(_run_summary_line(kind, summary))
    if mb is not None:
        log(roofline.line(roof))
    log(f"wrote {out}")
    print(out)
    if complete:
        return 0
    failed = [r for r in rows if not r["warmup"] and "error" in r]
    first = f" (first: {failed[0]['error']})" if failed else ""
    log(
        f"error: {valid} valid of {a.repetitions if a.concurrency is None else len(failed) + valid} measured "
        f"requests{first}; the finished ones are kept in {out}"
        + ("; run the same command again to measure the rest" if a.concurrency is None else "")
    )
    return 1


def _resumable_rows(out: Path, doc: dict[str, Any], log: runner.Log) -> list[dict[str, Any]]:
    """The rows of an unfinished run of the same method, profile and model in `out`, else none."""
    try:
        old = json.loads(out.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ValueError(f"{out} exists but is not readable JSON ({e}); pick another -o or remove it") from None
    same = isinstance(old, dict) and results.schema_of(old) == doc["schema"]
    same = same and all(old.get(k) == doc[k] for k in ("kind", "profile", "served_model"))
    same = same and isinstance(old.get("method"), dict) and old["method"] == doc["method"]
    if not same or old.get("complete") is not False or not isinstance(old.get("runs"), list):
        log(f"note: replacing {out} (not an unfinished run of this method)")
        return []
    if doc["kind"] != "sequential":
        log(f"note: {out} is an interrupted concurrency phase; its rates need one uninterrupted phase: measuring anew")
        return []
    rows = [r for r in old["runs"] if isinstance(r, dict) and isinstance(r.get("warmup"), bool)]
    doc["started_at"] = old.get("started_at", doc["started_at"])
    return rows


def _save(doc: dict[str, Any], out: Path) -> None:
    try:
        results.write(doc, out)
    except OSError as e:
        raise OSError(f"cannot write the results file {out}: {e.strerror or e}; pass a writable -o") from None


def _run_summary_line(kind: str, s: dict[str, Any]) -> str:
    if kind == "concurrency":
        return (
            f"summary: {s['requests']} requests ({s['errors']} failed), aggregate {s['aggregate_tok_s']:.2f} tok/s"
            + (
                f", latency P50/P95/P99 {s['latency_s']['p50']:.2f}/{s['latency_s']['p95']:.2f}/"
                f"{s['latency_s']['p99']:.2f} s"
                if s["latency_s"]
                else ""
            )
        )
    line = f"summary: {s['total_time_s']:.2f} s per request, effective {s['effective_tok_s']:.2f} tok/s"
    if s.get("predicted_per_second"):
        line += (
            f", server generation {s['predicted_per_second']:.2f} tok/s, harness overhead "
            f"{s['harness_overhead_ms']:.1f} ms per request ({s['harness_overhead_pct']:.2f}%)"
        )
    if s.get("draft_acceptance") is not None:
        line += f", draft acceptance {s['draft_acceptance']:.1%}"
    return line


def _json_file(path: Path) -> object:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{path}: not JSON ({e})") from None


def cmd_report(a: argparse.Namespace) -> int:
    from gguf_serve.local.bench import smoke

    runs, figures = [], []
    for path in a.files:  # smoke files (a workstation's `bench smoke --out`) go beside the guide's claim
        doc = _json_file(path)
        if isinstance(doc, dict) and doc.get("schema") == smoke.SCHEMA:
            runs.append(smoke.from_json(doc, str(path)))
        else:
            figures.append(path)
    res = results.load(figures, catalog=load_catalog())
    text = tables.report(res, utilization=a.utilization)
    if runs:
        text += "\n## The consumer-GPU guide's check (`bench smoke`)\n\n" + "\n".join(smoke.comparison(runs)) + "\n"
    if a.charts:
        from gguf_serve.local.bench import charts

        for path in charts.render_all(res, a.charts, utilization=a.utilization):
            print(f"wrote {path}", file=sys.stderr)
    if a.output:
        a.output.write_text(text, encoding="utf-8")
        print(f"wrote {a.output}", file=sys.stderr)
    else:
        print(text, end="")
    return 0


def cmd_cost(a: argparse.Namespace) -> int:
    if (a.instance is None) != (a.tok_s is None):
        raise SystemExit("give --instance and --tok-s together")
    catalog = load_catalog()
    hardware = cost.priced_hardware(catalog)
    if a.instance:
        entries = [(a.instance, a.tok_s, "given")]
    else:
        res = results.load(a.files, catalog=catalog)
        prefix = tables.family_prefix(res)
        entries = [
            (m.instance_type, m.effective_tok_s, f"{tables.short_model(m, prefix)}, MTP {tables.on_off(m.mtp)}")
            for m in tables.best_per_instance(res)
        ]
    costs = []
    for instance, tok_s, config in entries:
        for c in (
            cost.ri_cost(instance, tok_s, a.utilization, hardware=hardware)
            if cost.has_ri(instance, hardware)
            else None,
            cost.on_demand_cost(instance, tok_s, a.utilization, hardware=hardware),
        ):
            if c is not None:
                costs.append((config, c))
    if a.json:
        print(
            json.dumps(
                {"convention": cost.CONVENTION, "costs": [{"configuration": cfg, **asdict(c)} for cfg, c in costs]},
                indent=2,
            )
        )
        return 0
    rows = [
        [
            c.instance_type,
            cfg,
            f"{c.tok_s:.2f}",
            "1-yr RI all upfront" if c.pricing == "ri-1yr-all-upfront" else "on-demand",
            cost.money(c.yearly_cny, decimals=0, estimate=c.estimate) if c.yearly_cny else tables.NONE,
            cost.money(c.monthly_cny, estimate=c.estimate),
            cost.money(c.cny_per_million, estimate=c.estimate, unit="¥"),
        ]
        for cfg, c in costs
    ]
    header = ["Instance", "Configuration", "tok/s", "Pricing", "Yearly (¥)", "Monthly (¥)", "¥/M output tokens"]
    print(tables.markdown(header, rows))
    print(
        f"\nUtilization {a.utilization:.0%}. Convention: {cost.CONVENTION}. ~ marks an estimate "
        "(on-demand prices are not published for Ningxia; the catalog's are estimates)."
    )
    return 0


def cmd_recommend(a: argparse.Namespace) -> int:
    figures = results.load(a.figures, catalog=load_catalog())
    if a.gpu_quota is None:
        if a.json:
            raise SystemExit("--json needs an answer: --gpu-quota or --no-gpu-quota")
        print(recommend.render_tree(figures, a.utilization))
        return 0
    r = recommend.recommend(gpu_quota=a.gpu_quota, priority=a.priority, figures=figures, utilization=a.utilization)
    print(json.dumps(asdict(r), indent=2, ensure_ascii=False) if a.json else recommend.render(r))
    return 0


def cmd_smoke(a: argparse.Namespace) -> int:
    from gguf_serve.local.bench import smoke

    client = make_client(a.endpoint, resolve_api_key(api_key=a.api_key, secret_id=None, region=None))
    model = a.model or served_model(client)
    results = smoke.run_smoke(client, model)
    print(smoke.report(results, label=f"{a.label} ({model})"))
    if a.out:
        a.out.write_text(json.dumps(smoke.to_json(results, label=a.label, endpoint_model=model), ensure_ascii=False))
    return 0 if all(r.completion_tokens > 0 for r in results) else 1


COMMANDS = {"smoke": cmd_smoke, "run": cmd_run, "report": cmd_report, "cost": cmd_cost, "recommend": cmd_recommend,
            "capacity": capacity_cli.cmd_capacity, "bandwidth": capacity_cli.cmd_bandwidth,
            "roofline": capacity_cli.cmd_roofline}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    from botocore.exceptions import BotoCoreError, ClientError
    from openai import OpenAIError

    args = parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except (ValueError, OSError, OpenAIError, BotoCoreError, ClientError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("error: interrupted; finished requests are in the results file: run the same command to resume",
              file=sys.stderr)  # fmt: skip
        return 130
