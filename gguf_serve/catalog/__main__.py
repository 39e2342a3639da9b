"""`gguf-serve-catalog lock <model-or-profile>` pins a model; `gguf-serve-catalog check` validates every profile.

gguf-serve-catalog lock Qwen3.6-27B                 # ModelScope (MODELSCOPE_ENDPOINT or --endpoint overrides)
gguf-serve-catalog lock gpu-mtp                     # the model a serving profile names
gguf-serve-catalog check                            # every profile: what it plans, and whether it deploys
gguf-serve-catalog prices --region cn-northwest-1   # the AWS Price List against profiles/hardware.toml (--write)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from gguf_serve.catalog import model_facts
from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.loader import LOCK_NAME, PROFILES_DIR, load_catalog
from gguf_serve.catalog.profiles import deploy_refusal, memory_fit
from gguf_serve.errors import InputError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gguf-serve-catalog", description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=PROFILES_DIR, help="the profile folder (default: profiles/)")
    sub = parser.add_subparsers(dest="command", required=True)
    lock = sub.add_parser("lock", help="pin a model's size, sha256 and GGUF header facts from ModelScope")
    lock.add_argument("target", help="a model of profiles/models.toml, or a serving profile's name")
    lock.add_argument("--endpoint", help="ModelScope endpoint (default: MODELSCOPE_ENDPOINT, else modelscope.cn)")
    lock.add_argument("--lock-file", type=Path, help=f"default: <profiles>/{LOCK_NAME}")
    stacks = sub.add_parser("stacks", help="the stack names the profiles declare, one a line")
    stacks.add_argument("--deployable", action="store_true", help="only stacks whose model has a pinned sha256")
    check = sub.add_parser("check", help="load and validate every profile; print what each plans")
    check.add_argument("--lock-file", type=Path, help=f"default: <profiles>/{LOCK_NAME}")
    prices = sub.add_parser("prices", help="EC2 prices from the AWS Price List API against profiles/hardware.toml")
    prices.add_argument("--region", default="cn-northwest-1", help="the region whose prices to read (default Ningxia)")
    prices.add_argument("--write", action="store_true", help="write the API's prices into the file (price lines only)")
    prices.add_argument("--hardware-file", type=Path, help="default: <profiles>/hardware.toml")
    args = parser.parse_args(argv)
    try:
        if args.command == "prices":
            return _prices(args.hardware_file or args.profiles / "hardware.toml", args.region, write=args.write)
        if args.command == "lock":
            return _lock(args.profiles, args.target, args.endpoint, args.lock_file or args.profiles / LOCK_NAME)
        if args.command == "stacks":
            profiles = load_catalog(args.profiles).profiles.values()
            names = [p.stack_name for p in profiles if p.stack_name and not (args.deployable and deploy_refusal(p))]
            print("\n".join(names))
            return 0
        return _check(args.profiles, args.lock_file)
    except InputError as e:  # a profile or lock file that cannot work: one line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 1


def _lock(root: Path, target: str, endpoint: str | None, lock_file: Path) -> int:
    from gguf_serve.catalog.loader import _toml
    from gguf_serve.catalog.lookup import lock_and_commit

    declared = _toml(root / "models.toml")
    name = target
    if name not in declared:
        profile = root / "serving" / f"{target}.toml"
        name = _toml(profile).get("model", "") if profile.is_file() else ""
        if name not in declared:
            known = ", ".join(sorted(declared))
            raise ProfileError(f"{target!r} is neither a model of {root / 'models.toml'} ({known}) nor a profile")
    result = lock_and_commit(name, root=root, lock_file=lock_file, endpoint=endpoint)  # validated, then written
    e = result.entry
    facts = e.header
    print(f"locked {name}: {e.repo}/{e.file}@{e.revision} (commit {e.commit or 'not listed'})")
    print(f"  size {e.size_bytes:,} bytes, sha256 {e.sha256}")
    print(f"  header: {result.bytes_read:,} bytes in {result.requests} range requests from {e.served_by} "
          f"({facts['architecture']})")  # fmt: skip
    print(
        f"  kv cache {model_facts.kv_bytes_per_token(facts):,} bytes/token, recurrent state "
        f"{model_facts.recurrent_state_bytes(facts):,} bytes/slot, MTP layers {model_facts.mtp_layers(facts)}"
    )
    print(f"wrote {lock_file}")
    return 0


def _prices(path: Path, region: str, *, write: bool) -> int:
    """Read-only GetProducts calls; with write, the file's price lines replaced and checked by the loader first."""
    from botocore.exceptions import BotoCoreError, ClientError

    from gguf_serve.catalog import prices
    from gguf_serve.catalog.loader import load_hardware

    if write and region != prices.FILE_REGION:
        raise ProfileError(f"{path} holds {prices.FILE_REGION} prices; --write needs --region {prices.FILE_REGION}")
    hardware = load_hardware(path)
    client = prices.pricing_client(region)
    try:
        listed = prices.fetch(client, sorted(hardware), region)
    except (BotoCoreError, ClientError) as e:
        print(f"error: the AWS Price List API ({client.meta.endpoint_url}) did not answer: {e}; "
              f"{path} stays as it is (the pinned prices)", file=sys.stderr)  # fmt: skip
        return 2
    found = prices.changes(hardware, listed)
    print(f"{len(listed)} of {len(hardware)} instance types priced by {client.meta.endpoint_url} for {region} "
          f"({prices.CURRENCY}; Spot is not in the Price List)")  # fmt: skip
    for name in sorted(set(hardware) - set(listed)):
        print(f"  {name}: not in the Price List for {region}")
    for c in found:
        pinned = "not in the file" if c.pinned is None else f"{c.pinned:g}"
        print(f"  {c.instance_type} {c.key}: {pinned} -> {c.listed:g}")
    if not found:
        print(f"{path}: every listed price matches")
        return 0
    if not write:
        print(f"{len(found)} prices differ; `gguf-serve-catalog prices --region {region} --write` writes them")
        return 0
    text = prices.write(path, found, region=region)
    staged = path.with_name(f".{path.name}.prices")
    staged.write_text(text, encoding="utf-8")
    try:
        load_hardware(staged)  # the loader's own checks, before the file is replaced
        staged.replace(path)
    finally:
        staged.unlink(missing_ok=True)
    print(f"wrote {len(found)} prices into {path}")
    return 0


def _check(root: Path, lock_file: Path | None) -> int:
    catalog = load_catalog(root, lock_file=lock_file)
    for p in catalog.profiles.values():
        need, capacity, where = memory_fit(p)
        stack = p.stack_name or "(no stack)"
        print(f"{p.name}: {stack} {p.hardware.instance_type} + {p.model.name}, MTP {'on' if p.mtp else 'off'}, "
              f"{p.server.parallel} x {p.server.ctx_per_slot} ctx, {p.threads} threads")  # fmt: skip
        print(f"  memory {need:.1f} of {capacity:.1f} GiB of {where}; boot budget {p.boot_budget_s // 60} min")
        if p.stack_name and deploy_refusal(p):
            print(f"  NOT DEPLOYABLE: {p.model.name} has no pinned sha256; `cdk synth` locks it where ModelScope is "
                  f"reachable, or run `gguf-serve-catalog lock {p.model.name}`")  # fmt: skip
    print(f"{len(catalog.profiles)} profiles valid ({catalog.root}, {catalog.lock_file})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
