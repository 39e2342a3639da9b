"""`gguf-serve-bench capacity` (the curve, written as it goes) and `gguf-serve-bench bandwidth` (the read probe)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from gguf_serve.catalog import load_catalog
from gguf_serve.local.bench import bandwidth, capacity, method, results, roofline, runner
from gguf_serve.local.bench.target import add_target, connect

RESULTS_DIR = Path("results/local")
PROGRESS_EVERY_S = 10.0


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


def _fraction(text: str) -> float:
    value = float(text)
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError("a fraction in (0, 1), e.g. 0.1 for 10%")
    return value


def _streams(text: str) -> list[int]:
    try:
        return capacity.parse_streams(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_roofline_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--gguf", type=Path, help="the served GGUF file: exact bytes per token from its tensor table")
    probe = p.add_mutually_exclusive_group()
    probe.add_argument(
        "--measure-bandwidth", action="store_true",
        help="run the read probe here first (only where this host serves: loopback, or on the instance)",
    )  # fmt: skip
    probe.add_argument(
        "--bandwidth-gbs", type=float, metavar="GB_S", help="the probe's GB/s from `gguf-serve-bench bandwidth` there"
    )


def add_parser(sub: Any) -> None:
    cap = sub.add_parser("capacity", help="the report's method at rising concurrency: the capacity curve and its knee")
    add_target(cap)
    steps = cap.add_mutually_exclusive_group()
    steps.add_argument("--streams", type=_streams, help="stream counts to step through, e.g. 1,2,3,4")
    steps.add_argument(
        "--max-streams", type=_positive, default=capacity.DEFAULT_MAX_STREAMS,
        help=f"1, 2, 4, ... up to N streams (default {capacity.DEFAULT_MAX_STREAMS})",
    )  # fmt: skip
    cap.add_argument(
        "--max-tokens", type=_positive, default=method.MAX_TOKENS, help=f"default {method.MAX_TOKENS}, the report's"
    )
    cap.add_argument("--repetitions", type=_positive, default=1, help="measured requests per stream at each step")
    cap.add_argument(
        "--warmup", type=_non_negative, default=method.WARMUP, help="unmeasured requests before the first step"
    )
    cap.add_argument(
        "--knee-growth", type=_fraction, default=capacity.KNEE_GROWTH,
        help=f"aggregate growth a step must add to be worth its streams (default {capacity.KNEE_GROWTH:g})",
    )  # fmt: skip
    cap.add_argument("--ttft-limit", type=float, metavar="S", help="P95 TTFT limit (default: the stacks' alarm)")
    cap.add_argument("--price-instance", help="price the curve as this instance type (default: the profile's)")
    add_roofline_options(cap)
    cap.add_argument("--chart", type=Path, help="write a PNG: aggregate tok/s and ¥/M against streams")
    cap.add_argument("--markdown", type=Path, help="also write the table and the knee to this file")
    cap.add_argument("-o", "--output", type=Path, help=f"results JSON (default {RESULTS_DIR}/<profile>-capacity-...)")
    cap.add_argument("--from", dest="source", type=Path, help="render a capacity results file; measure nothing")
    roof = sub.add_parser("roofline", help="bytes read per token and the GB/s each figure implies (the report's)")
    roof.add_argument("files", nargs="*", type=Path, help="results files (default: the field report's figures)")
    roof.add_argument("--all", action="store_true", help="every configuration, not each instance's best")
    bw = sub.add_parser("bandwidth", help="a STREAM-style read probe of this host's memory (run it on the server)")
    bw.add_argument("--probe-mib", type=_positive, default=bandwidth.DEFAULT_MIB, help="array size (default 1 GiB)")
    bw.add_argument("--threads", type=_positive, help="default: every CPU")
    bw.add_argument("--json", action="store_true")


def cmd_roofline(a: argparse.Namespace) -> int:
    catalog = load_catalog()
    print(roofline.figures_table(results.load(a.files, catalog=catalog), catalog, every=a.all))
    return 0


def cmd_bandwidth(a: argparse.Namespace) -> int:
    b = bandwidth.measure(mib=a.probe_mib, threads=a.threads)
    print(json.dumps(b.to_json(), indent=2) if a.json else bandwidth.line(b))
    return 0


def probe(a: argparse.Namespace, log: runner.Log) -> dict[str, Any] | None:
    """The serving host's read bandwidth: measured here (before any request loads the server) or as given."""
    if a.bandwidth_gbs is not None:
        return {"gb_s": a.bandwidth_gbs, "threads": None, "host": "given (--bandwidth-gbs)"}
    if not a.measure_bandwidth:
        return None
    from urllib.parse import urlsplit

    host = urlsplit(a.endpoint).hostname or ""
    if a.sagemaker_endpoint or host not in ("127.0.0.1", "localhost", "::1"):
        log(f"warning: --measure-bandwidth reads this host's memory, but {a.endpoint} is served elsewhere: run "
            "`gguf-serve-bench bandwidth` on the serving host and pass --bandwidth-gbs")  # fmt: skip
    b = bandwidth.measure()
    log(bandwidth.line(b))
    return b.to_json()


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _server_slots(a: argparse.Namespace, client: Any) -> int | None:
    """llama-server's slot count (GET /props): steps above it queue."""
    if a.sagemaker_endpoint:
        return None
    from gguf_serve.container.metrics.scrape import ScrapeError, fetch_total_slots

    try:
        return fetch_total_slots(a.endpoint.rstrip("/").removesuffix("/v1"), client.api_key, timeout=10)
    except (ScrapeError, OSError):
        return None


def _load() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def cmd_capacity(a: argparse.Namespace) -> int:
    from openai import __version__ as openai_version

    catalog = load_catalog()
    if a.source:
        doc = json.loads(a.source.read_text(encoding="utf-8"))
        if not isinstance(doc, dict) or doc.get("schema") != capacity.SCHEMA:
            raise ValueError(f"{a.source}: not a capacity results file (schema {capacity.SCHEMA!r})")
        return _render(a, doc, catalog)
    log = runner.stderr_log
    plan = a.streams or capacity.doubling(a.max_streams)
    label, client, served = connect(a, catalog, log)
    profile = capacity.base_profile(a.profile, catalog)
    gpu = profile is not None and profile.hardware.has_gpu
    ttft_limit = a.ttft_limit or capacity.TTFT_P95_LIMIT_S["gpu" if gpu else "cpu"]
    price_type = a.price_instance or (profile.hardware.instance_type if profile else label.instance_type)
    note = "" if price_type == label.instance_type else f"priced as {price_type}; measured on {label.instance_type}"
    price = capacity.price_for(price_type, catalog, note=note)
    model = label.model or served
    started = _now()
    desc = {**method.describe(max_tokens=a.max_tokens, repetitions=a.repetitions, warmup=a.warmup, concurrency=None),
            "streams": plan, "stream": True, "knee_growth": a.knee_growth, "ttft_p95_limit_s": ttft_limit}  # fmt: skip
    doc: dict[str, Any] = {
        "schema": capacity.SCHEMA, "kind": "capacity", "profile": a.profile, "instance_type": label.instance_type,
        "hardware": label.hardware, "model": model, "moe": results.is_moe(model, catalog), "served_model": served,
        "endpoint": a.endpoint, "started_at": started, "finished_at": None, "complete": False, "method": desc,
        "price": vars(price) if price else None, "server_slots": _server_slots(a, client), "bandwidth": None,
        "model_bytes": None, "steps": [], "current": None, "knee": None,
        # the client's 1-minute load average at start and end: on a shared host, contention shows here
        "harness": {"openai": openai_version, "client_cpus": os.cpu_count(), "client_loadavg_1m": [_load(), None]},
    }  # fmt: skip
    out = a.output or RESULTS_DIR / f"{a.profile}-capacity-{started.replace(':', '').replace('+0000', 'Z')}.json"
    kept = _resumable_steps(out, doc, log)
    doc["steps"] = kept
    _save(doc, out)  # before the first request: an unwritable -o fails now
    mtp = bool(label.mtp)
    mb = roofline.model_bytes(catalog, model, gguf=a.gguf, mtp=mtp)
    doc["model_bytes"] = vars(mb) if mb else None
    doc["bandwidth"] = probe(a, log)
    peak = doc["bandwidth"]["gb_s"] if doc["bandwidth"] else None
    slots = doc["server_slots"]
    if slots is not None and slots < plan[-1]:
        log(f"note: the server has {slots} slots; steps above {slots} streams queue (TTFT grows, aggregate cannot): "
            f"to find the host's knee, start llama-server with --parallel {plan[-1]} or more")  # fmt: skip
    todo = [n for n in plan if n not in {s["streams"] for s in kept}]
    log(f"capacity of {served} at {a.endpoint} ({a.profile}): streams {', '.join(map(str, plan))}, "
        f"{a.repetitions} request(s) per stream, max_tokens {a.max_tokens}"
        + (f"; {len(kept)} steps kept from {out}" if kept else ""))  # fmt: skip
    interrupted = False
    try:
        for i, n in enumerate(todo):
            step = _measure_step(a, client, served, n, warmup=a.warmup if i == 0 else 0, doc=doc, out=out, log=log,
                                 price=price, mb=mb, peak=peak)  # fmt: skip
            doc["steps"] = sorted([*doc["steps"], step], key=lambda s: s["streams"])
            doc["current"] = None
            _save(doc, out)
            log(_step_line(step))
    except KeyboardInterrupt:
        interrupted = True
        doc["current"] = None
    done = {s["streams"] for s in doc["steps"]}
    doc["complete"] = not interrupted and all(n in done for n in plan)
    doc["finished_at"] = _now()
    doc["harness"]["client_loadavg_1m"][1] = _load()
    knee = capacity.find_knee(doc["steps"], min_growth=a.knee_growth, ttft_limit_s=ttft_limit)
    doc["knee"] = vars(knee)
    _save(doc, out)
    log(f"wrote {out}")
    code = _render(a, doc, catalog)
    if interrupted:
        log(f"interrupted: {len(doc['steps'])} finished steps kept in {out}; run the same command to measure the rest")
        return 130
    return code if any(s["summary"] for s in doc["steps"]) else 1


def _measure_step(
    a: argparse.Namespace, client: Any, served: str, n: int, *, warmup: int, doc: dict[str, Any], out: Path,
    log: runner.Log, price: capacity.Price | None, mb: roofline.ModelBytes | None, peak: float | None,
) -> dict[str, Any]:  # fmt: skip
    doc["current"] = {"streams": n, "runs": []}
    total = n * a.repetitions
    log(f"[{capacity.streams_text(n)}] {total} request(s), max_tokens {a.max_tokens}")
    next_report = [PROGRESS_EVERY_S]

    def keep(row: dict[str, Any]) -> None:
        doc["current"]["runs"].append(row)
        _save(doc, out)

    def tick(elapsed: float) -> None:
        if elapsed >= next_report[0]:
            next_report[0] += PROGRESS_EVERY_S
            finished = sum(1 for r in doc["current"]["runs"] if not r["warmup"])
            log(f"[{capacity.streams_text(n)}] {elapsed:.0f} s: {finished}/{total} requests finished")

    load_before = _load()
    rows, wall = runner.run_concurrent(
        client, served, concurrency=n, repetitions=a.repetitions, warmup=warmup, max_tokens=a.max_tokens, log=log,
        on_row=keep, tick=tick,
    )  # fmt: skip
    summary = capacity.step_summary(rows, wall, n, price=price, model_bytes=mb, peak_gb_s=peak)
    return {"streams": n, "wall_s": wall, "finished_at": _now(), "client_loadavg_1m": [load_before, _load()],
            "runs": rows, "summary": summary}  # fmt: skip


def _step_line(step: dict[str, Any]) -> str:
    s, n = step["summary"], step["streams"]
    if s is None:
        return f"[{capacity.streams_text(n)}] no valid request ({len(step['runs'])} failed)"
    text = (
        f"[{capacity.streams_text(n)}] aggregate {s['aggregate_tok_s']:.2f} tok/s, "
        f"per stream {s['per_stream_tok_s']:.2f}, "
        f"TTFT P50/P95 {s['ttft_ms']['p50']:.0f}/{s['ttft_ms']['p95']:.0f} ms, "
        + (f"ITL P95 {s['itl_ms']['p95']:.1f} ms, " if s.get("itl_ms") else "")
        + f"{s['errors']} failed ({s['rate_limited']} x 429)"
    )
    if s.get("cny_per_million") is not None:
        text += f", ¥{s['cny_per_million']:.2f}/M tokens"
    if s.get("roofline"):
        text += "; " + roofline.line(roofline.Roofline(**s["roofline"]))
    return text


def _render(a: argparse.Namespace, doc: dict[str, Any], catalog: Any) -> int:
    """The table, the knee and what to write into the profile (stdout, --markdown), and the chart (--chart)."""
    m = doc["method"]
    knee = capacity.find_knee(doc["steps"], min_growth=m["knee_growth"], ttft_limit_s=m["ttft_p95_limit_s"])
    profile = capacity.base_profile(doc["profile"], catalog)
    lines = [
        f"## Capacity: {doc['model']} on {doc['hardware']} ({doc['profile']}), max_tokens {m['max_tokens']}",
        "",
        capacity.table(doc),
        "",
        capacity.caption(doc),
        "",
        f"knee: {capacity.streams_text(knee.streams)}: {knee.reason}",
        *capacity.recommendation(knee, profile, catalog, measured_on=doc["instance_type"]),
    ]
    if not doc.get("complete"):
        lines.append(f"(unfinished: {len(doc['steps'])} of {len(m['streams'])} steps)")
    text = "\n".join(lines) + "\n"
    print(text, end="")
    if a.markdown:
        a.markdown.write_text(text, encoding="utf-8")
    if a.chart:
        from gguf_serve.local.bench import charts

        if charts.capacity_chart(doc, a.chart, knee=knee.streams) is not None:
            print(f"wrote {a.chart}", file=sys.stderr)
    return 0


def _resumable_steps(out: Path, doc: dict[str, Any], log: runner.Log) -> list[dict[str, Any]]:
    """Finished steps of an unfinished run of the same method, profile and model in `out`, else none."""
    try:
        old = json.loads(out.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as e:
        raise ValueError(f"{out} exists but is not readable JSON ({e}); pick another -o or remove it") from None
    same = isinstance(old, dict) and old.get("schema") == capacity.SCHEMA and old.get("complete") is False
    same = same and all(old.get(k) == doc[k] for k in ("profile", "served_model", "method"))
    if not same or not isinstance(old.get("steps"), list):
        if out.exists():
            log(f"note: replacing {out} (not an unfinished capacity run of this method)")
        return []
    doc["started_at"] = old.get("started_at", doc["started_at"])
    return [s for s in old["steps"] if isinstance(s, dict) and s.get("streams") in doc["method"]["streams"]]


_WRITING = threading.Lock()  # a client thread finishing a request and the main thread may save at once


def _save(doc: dict[str, Any], out: Path) -> None:
    try:
        with _WRITING:
            results.write(doc, out)
    except OSError as e:
        raise OSError(f"cannot write the results file {out}: {e.strerror or e}; pass a writable -o") from None
