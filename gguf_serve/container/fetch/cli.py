"""gguf-serve-fetch: fetch one GGUF from the S3 cache or ModelScope, verified and resumable.

  gguf-serve-fetch --spec /etc/gguf-serve/runtime.json --dest /models --s3-cache s3://bucket/models
  gguf-serve-fetch --repo unsloth/Qwen3.6-35B-A3B-MTP-GGUF --file Qwen3.6-35B-A3B-UD-Q4_K_M.gguf \\
      --revision master --sha256 0b21...58b --size 22663387424 --dest /models

On success it prints one JSON line on stdout: path, size, sha256, source, transfer figures, and the GGUF's
architecture, nextn_predict_layers and has_mtp_layers. Logs and the progress bar go to stderr.

Exit status: 0 fetched and verified; 1 fetch failed (one line on stderr saying what to do); 2 bad arguments;
3 the file is not what the runtime spec expects (architecture, or MTP requested but no MTP layers).
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Any

from gguf_serve.container.fetch.errors import FetchError
from gguf_serve.container.fetch.fetch import FileSpec, fetch_file
from gguf_serve.container.fetch.modelscope import DEFAULT_ENDPOINT
from gguf_serve.container.fetch.pace import RatePolicy
from gguf_serve.container.fetch.progress import human_bytes
from gguf_serve.container.fetch.ranged import MIB
from gguf_serve.container.fetch.retry import RetryPolicy

log = logging.getLogger("gguf-serve-fetch")

EXIT_FAILED, EXIT_USAGE, EXIT_MISMATCH = 1, 2, 3


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="gguf-serve-fetch",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    what = ap.add_argument_group("what to fetch (a runtime spec, or an explicit file)")
    what.add_argument("--spec", type=Path, help="a runtime spec (gguf_serve.container.spec.RuntimeSpec.to_json)")
    what.add_argument("--repo", help="ModelScope repo, owner/name")
    what.add_argument("--file", help="file path inside the repo")
    what.add_argument("--revision", default=None, help="branch, tag or commit (default master)")
    what.add_argument("--sha256", help="expected sha256 (default: ModelScope's listing)")
    what.add_argument("--size", type=int, help="expected size in bytes (default: ModelScope's listing)")
    how = ap.add_argument_group("where from and to")
    how.add_argument("--dest", type=directory, required=True, help="directory the file lands in (created if missing)")
    how.add_argument("--s3-cache", help="s3://bucket/prefix of the in-region model cache (read first, written back)")
    how.add_argument("--no-upload", action="store_true", help="do not write a ModelScope download back to the cache")
    how.add_argument(
        "--endpoint", default=None, help=f"ModelScope endpoint (default $MODELSCOPE_ENDPOINT or {DEFAULT_ENDPOINT})"
    )
    how.add_argument(
        "--connections", type=positive_int, default=8, help="parallel connections to ModelScope (default 8)"
    )
    how.add_argument(
        "--s3-connections", type=positive_int, default=16, help="parallel GETs from the S3 cache (default 16)"
    )
    how.add_argument("--part-size-mib", type=positive_int, default=16, help="MiB per ranged request (default 16)")
    add_network_options(how)
    how.add_argument("--require-mtp", action="store_true", help="exit 3 unless the GGUF has MTP layers")
    how.add_argument("--quiet", action="store_true", help="no progress output")
    return ap


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def directory(text: str) -> Path:
    """A directory path, never '' (Path('') is '.': the current directory). A file there fails at the fetch."""
    if not text.strip():
        raise argparse.ArgumentTypeError("is empty: name the directory the model goes in, e.g. --dest /models")
    return Path(text)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not value > 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text!r}")
    return value


def add_network_options(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """Retry and pace options, shared with `launcher fetch`."""
    d = RatePolicy()
    group.add_argument(
        "--retries", type=positive_int, default=RetryPolicy().attempts,
        help="failures in a row on one range before giving up (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--min-rate-kib", type=positive_float, default=d.min_bps / 1024,
        help="slowest acceptable KiB/s per connection, averaged over --rate-window (default %(default)s)",
    )  # fmt: skip
    group.add_argument(
        "--rate-window", type=positive_float, default=d.window_s,
        help="seconds the minimum rate is averaged over; also the idle timeout and the deadline for a response's "
        "headers (default %(default)s)",
    )  # fmt: skip


def network_policies(a: argparse.Namespace) -> tuple[RetryPolicy, RatePolicy]:
    rate = RatePolicy(
        min_bps=a.min_rate_kib * 1024, window_s=a.rate_window, idle_s=a.rate_window, headers_s=a.rate_window
    )
    return RetryPolicy(attempts=a.retries), rate


def main(argv: list[str] | None = None) -> int:
    ap = build_parser()
    a = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s gguf-serve-fetch %(levelname)s %(message)s")
    try:
        spec, expect = _spec(a)
        spec.check()
    except (ValueError, FetchError) as e:
        ap.error(str(e))
    retry, rate = network_policies(a)
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = fetch_file(
            spec,
            a.dest,
            endpoint=a.endpoint,
            s3_cache=a.s3_cache,
            connections=a.connections,
            s3_connections=a.s3_connections,
            part_size=a.part_size_mib * MIB,
            upload=not a.no_upload,
            progress=not a.quiet,
            retry=retry,
            rate=rate,
        )
    except FetchError as e:
        log.error("%s", e)
        return EXIT_FAILED
    except KeyboardInterrupt:
        log.error("interrupted; run the same command again to resume")
        return 130
    except OSError as e:  # the disk or the folder, not the network (those are FetchErrors)
        log.error("fetch failed: %s; check %s and its volume", _os_reason(e), a.dest)
        return EXIT_FAILED
    summary = result.as_dict()
    print(json.dumps(summary), flush=True)
    problem = _check_model(summary, expect, require_mtp=a.require_mtp)
    if problem:
        log.error("%s", problem)
        return EXIT_MISMATCH
    if result.gguf is not None:
        log.info("%s ready (%s from %s): GGUF %s, nextn_predict_layers %d", result.path, human_bytes(result.size),
                 result.source, result.gguf.architecture, result.gguf.nextn_predict_layers)  # fmt: skip
    else:
        log.info("%s ready (%s from %s); not a GGUF file", result.path, human_bytes(result.size), result.source)
    return 0


def _spec(a: argparse.Namespace) -> tuple[FileSpec, dict[str, Any]]:
    if a.spec is not None:
        if a.repo or a.file:
            raise ValueError("give either --spec or --repo/--file, not both")
        from gguf_serve.container.spec import RuntimeSpec, RuntimeSpecError

        try:
            runtime_spec = RuntimeSpec.load(a.spec)
        except RuntimeSpecError as e:
            raise ValueError(str(e)) from None
        m = runtime_spec.model
        expect = {"architecture": m.gguf_architecture, "mtp": runtime_spec.mtp, "name": runtime_spec.name}
        return FileSpec.from_artifact(m), expect
    if not (a.repo and a.file):
        raise ValueError("--repo and --file are required without --spec")
    spec = FileSpec(
        repo=a.repo,
        file=a.file,
        revision=a.revision or "master",
        size=a.size,
        sha256=a.sha256.lower() if a.sha256 else None,
        size_estimate=a.size,
    )
    return spec, {}


def _check_model(summary: dict[str, Any], expect: dict[str, Any], *, require_mtp: bool) -> str | None:
    arch, has_mtp = summary["architecture"], summary["has_mtp_layers"]
    want_mtp = require_mtp or expect.get("mtp", False)
    if arch is None and (want_mtp or expect):
        return f"{summary['path']} is not a readable GGUF file"
    if expect and arch != expect["architecture"]:
        return (
            f"{summary['path']} is a {arch} model but the runtime spec of {expect['name']} expects "
            f"{expect['architecture']}; fix that profile's model"
        )
    if want_mtp and not has_mtp:
        return (
            f"{summary['path']} has no MTP layers ({arch}.nextn_predict_layers is 0 or absent) but MTP is requested; "
            "use an *-MTP-GGUF file or turn speculative decoding off"
        )
    return None


def _os_reason(e: OSError) -> str:
    return f"{e.strerror or type(e).__name__}" + (f": {e.filename}" if e.filename else "")


def _terminate(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # unwinds the download, which saves its progress for the next run


if __name__ == "__main__":
    sys.exit(main())
