"""Lock on first synth, the way the CDK resolves a context lookup once and keeps it in cdk.context.json.

`cdk synth|deploy` runs the app, which calls `resolve_locks` before it builds a stack. A stack's model without a
lock from a live listing (no entry, or `locked_from = "typed"`) is locked here as `gguf-serve-catalog lock` does it
(ModelScope's listing, the GGUF header by HTTP Range; MODELSCOPE_ENDPOINT selects another hub), written to the lock
file, and named in one line: commit the file, and no later synth opens a socket. A typed entry with a sha256 is
checked, not trusted: a listing that disagrees refuses the model's stacks with both values; one that agrees
upgrades the entry.

Which stacks: the CLI runs the app once and picks the selected stacks out of the assembly, so the app cannot know
the selection. Like the CLI's own context lookups, which run for every stack of the assembly, this resolves the
model of every stack the app builds. A failed lookup refuses only the stacks of that model (an error annotation),
so `cdk deploy GravitonMoeStack` still works when the hub is down and GpuMtpStack's model is unlocked. The
instance still verifies the pinned sha256 of every byte before serving: this only decides what is pinned.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.catalog.lock import HubUnreachable, LockResult, lock_model
from gguf_serve.catalog.lockfile import LockedModel, commit_entry, read_lock

# A synth should learn that the hub is down in seconds, not after the backoff a download may afford.
SYNTH_RETRY_ATTEMPTS = 1


@dataclass(frozen=True)
class Resolution:
    refused: dict[str, str] = field(default_factory=dict)  # model -> why its stacks must not deploy
    unchecked: dict[str, str] = field(default_factory=dict)  # model -> why a typed sha256 was used unchecked
    locked: dict[str, LockResult] = field(default_factory=dict)  # model -> what was written


def stack_models(root: Path, folder: str = "serving") -> dict[str, str]:
    """stack name -> model name, read from profiles/serving/*.toml (or profiles/sagemaker/*.toml: the endpoint
    profiles) before anything is built (a file the loader will refuse is left to the loader, which names file and
    key)."""
    from gguf_serve.catalog.loader import _toml

    out = {}
    for path in sorted((root / folder).glob("*.toml")):
        try:
            doc = _toml(path)
        except ProfileError:
            continue
        stack, model = doc.get("stack"), doc.get("model")
        if isinstance(stack, str) and stack and isinstance(model, str):
            out[stack] = model
    return out


def stack_files(root: Path, folder: str = "serving") -> dict[str, Path]:
    """stack name -> its profile file (the file a refusal names)."""
    from gguf_serve.catalog.loader import _toml

    out = {}
    for path in sorted((root / folder).glob("*.toml")):
        try:
            stack = _toml(path).get("stack")
        except ProfileError:
            continue
        if isinstance(stack, str) and stack:
            out[stack] = path
    return out


def lock_and_commit(
    name: str, *, root: Path, lock_file: Path, endpoint: str | None = None, retry: Any = None, rate: Any = None
) -> LockResult:
    """Lock a declared model and write its entry; nothing is written unless the catalog can build the model
    from it (header facts complete, the declaration matches) and no other part of the catalog breaks."""
    from gguf_serve.catalog.loader import _toml

    declared = _toml(root / "models.toml")
    if name not in declared:
        known = ", ".join(sorted(declared))
        raise ProfileError(f"{name!r} is not a model of {root / 'models.toml'} ({known})")
    d = declared[name]
    if not isinstance(d, dict) or not all(isinstance(d.get(k), str) for k in ("repo", "file")):
        raise ProfileError(f"{root / 'models.toml'}: {name!r} needs repo and file strings")
    revision = d.get("revision", "master")
    result = lock_model(name, repo=d["repo"], file=d["file"], revision=revision, endpoint=endpoint, retry=retry,
                        rate=rate)  # fmt: skip

    commit_entry(lock_file, result.entry, validate=improves(name, root, lock_file))
    return result


def improves(name: str, root: Path, lock_file: Path) -> Callable[[dict[str, LockedModel]], None]:
    """The check a new lock entry passes before it is written: the model builds from it, and the whole catalog
    (every model, serving and workstation profile) has no problem it did not have before; else ProfileError, and
    the lock file stays as it is (commit_entry)."""
    from gguf_serve.catalog.loader import load_catalog, load_models

    def check(entries: dict[str, LockedModel]) -> None:
        load_models(root / "models.toml", {name: entries[name]}, lock_file)
        before = load_catalog(root, lock_file=lock_file, skip_unlocked=True, tolerant=True).problems
        after = load_catalog(root, lock_file=lock_file, skip_unlocked=True, tolerant=True, locks=entries).problems
        new = {where: why for where, why in after.items() if where not in before}
        if new:
            where, why = next(iter(new.items()))
            more = f" (and {len(new) - 1} more)" if len(new) > 1 else ""
            raise ProfileError(
                f"the listing's facts for {name} would break {where}{more}: {why}; {lock_file} is left as it was: "
                f"change the profile (or the model declared) so it fits, then lock again"
            )

    return check


def resolve_locks(
    wanted: Iterable[str],
    *,
    root: Path,
    lock_file: Path,
    lookups: bool = True,
    allow_typed: bool = False,
    endpoint: str | None = None,
    say: Callable[[str], None] | None = None,
) -> Resolution:
    """Lock every wanted model that has no listing lock; see the module docstring. Opens no socket when each
    wanted model has one (or when lookups is False: `-c modelLookup=false`).

    allow_typed: a typed sha256 that could not be checked against a listing deploys (the deploy option
    allowTypedLock, said in one line); otherwise its stacks are refused, as an unlocked model's are."""
    from gguf_serve.catalog.loader import _toml

    say = say or (lambda line: print(line, file=sys.stderr))
    declared = _toml(root / "models.toml")
    out = Resolution()
    for name in sorted(set(wanted)):
        d = declared.get(name)
        if not isinstance(d, dict):
            continue  # the loader refuses the profile that names it, with file and key
        if bad := _bad_name(d, root / "models.toml", name):
            out.refused[name] = bad  # never sent to a hub, never locked: the loader refuses it the same way
            continue
        entry = read_lock(lock_file).get(name)
        current = (d.get("repo"), d.get("file"), d.get("revision", "master"))
        if entry is not None and (entry.repo, entry.file, entry.revision) != current:
            entry = None  # locked for another file than the one declared now: lock what is declared
        if entry is not None and entry.locked_from == "listing":
            continue
        typed_sha = entry.sha256 if entry is not None else None
        command = f"`gguf-serve-catalog lock {name}`"
        if not lookups:
            if typed_sha:
                _typed(out, name, f"{name}'s sha256 in {lock_file} is typed, not checked: lookups are off", allow_typed,
                       say)  # fmt: skip
            else:
                out.refused[name] = (
                    f"model {name} has no lock from ModelScope's listing in {lock_file} and lookups are off "
                    f"(-c modelLookup=false); run {command} where ModelScope is reachable and commit the file"
                )
            continue
        from gguf_serve.container.fetch.modelscope import resolve_endpoint
        from gguf_serve.container.fetch.retry import RetryPolicy

        hub = endpoint or _hub(resolve_endpoint)
        fetch_log = logging.getLogger("gguf-serve-fetch")
        level = fetch_log.level
        fetch_log.setLevel(logging.ERROR)  # a retry's warning line: the refusal below says it once
        try:
            result = _lookup(name, root, lock_file, endpoint, RetryPolicy(attempts=SYNTH_RETRY_ATTEMPTS, cap_s=2.0),
                             entry)  # fmt: skip
        except HubUnreachable as e:
            if typed_sha:
                why = f"{name}'s typed sha256 in {lock_file} was not checked against the listing: {e}"
                _typed(out, name, why, allow_typed, say)
            else:
                out.refused[name] = (
                    f"{e}. Synth reads {hub}'s file listing and the GGUF header once, to pin the sha256 every "
                    f"instance verifies before serving; run this again, or {command}, where {hub} is reachable "
                    f"(MODELSCOPE_ENDPOINT selects another hub), and commit {lock_file}"
                )
            continue
        except ProfileError as e:
            out.refused[name] = str(e)
            continue
        except OSError as e:  # the listing answered, but the lock file cannot be written (a read-only checkout)
            out.refused[name] = (
                f"model {name} was read from {hub}'s listing but {lock_file} cannot be written ({e.strerror or e}); "
                f"run synth in a writable checkout, or pass -c modelLock=<a writable copy of the file>"
            )
            continue
        finally:
            fetch_log.setLevel(level)
        out.locked[name] = result
        e = result.entry
        say(f"locked {name}: {e.repo} commit {e.commit or 'not listed'}, {e.size_bytes:,} bytes, sha256 {e.sha256} "
            f"(from {e.served_by}); wrote {lock_file}: commit this file")  # fmt: skip
    return out


def _bad_name(declared: dict[str, Any], path: Path, name: str) -> str:
    from gguf_serve.catalog.names import HUB_SHAPES

    for key in ("repo", "file"):
        value = declared.get(key)
        test, allowed = HUB_SHAPES[key]
        if not isinstance(value, str) or not test(value):
            return f"{path}: {name!r}.{key}: {value!r} is not allowed; allowed: {allowed}"
    return ""


def _typed(out: Resolution, name: str, why: str, allow: bool, say: Callable[[str], None]) -> None:
    """A typed sha256 nobody checked against a listing deploys only on purpose, and then says so in one line."""
    if allow:
        # A line, not a warning annotation: the CLI (2.1148) fails a selected stack with any annotation while
        # another stack of the assembly carries an error.
        out.unchecked[name] = why
        say(f"{why}; deploying it anyway (allowTypedLock = true); the instance still verifies the file before serving")
    else:
        out.refused[name] = (
            f"{why}. Its stacks deploy once a synth reaches the hub (it locks the model from the listing), or on "
            "purpose with -c allowTypedLock=true (deploy.toml: allowTypedLock = true)"
        )


def _hub(resolve: Callable[[], str]) -> str:
    try:
        return resolve()
    except Exception:  # a malformed MODELSCOPE_ENDPOINT: lock_model says so
        return "ModelScope"


def _lookup(
    name: str, root: Path, lock_file: Path, endpoint: str | None, retry: Any, typed: LockedModel | None
) -> LockResult:
    """Lock from the live listing; a typed sha256 or size the listing contradicts refuses, and nothing is written."""
    if typed is None or not typed.sha256:
        return lock_and_commit(name, root=root, lock_file=lock_file, endpoint=endpoint, retry=retry)
    probe = lock_model(name, repo=typed.repo, file=typed.file, revision=typed.revision, endpoint=endpoint, retry=retry)
    live = probe.entry
    if (live.sha256, live.size_bytes) != (typed.sha256, typed.size_bytes):
        raise ProfileError(
            f"{lock_file}: {name!r} is typed with sha256 {typed.sha256}, size {typed.size_bytes:,} bytes, but "
            f"{live.endpoint}'s listing of {typed.repo}/{typed.file}@{typed.revision} gives sha256 {live.sha256}, "
            f"size {live.size_bytes:,} bytes; the typed values are wrong or the file changed: check, then run "
            f"`gguf-serve-catalog lock {name}` to pin the listing's, and commit {lock_file}"
        )
    commit_entry(lock_file, live, validate=improves(name, root, lock_file))
    return probe
