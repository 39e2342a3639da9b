"""`cdk synth|deploy` locks a model on first synth, as the CDK resolves a context lookup once (catalog/lookup.py).

the local hub serves the 27B's repo and path with a small GGUF that has an MTP model's header facts (the stand-in of
tests/catalog/stand_in.py); `MODELSCOPE_ENDPOINT` points synth at it, as a user would point it at a mirror. The
real CLI runs from a clone of the working tree, so the lock it writes is the clone's profiles/models.lock.toml.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tomllib
from pathlib import Path

import pytest

from gguf_serve.catalog.lockfile import read_lock, render_lock
from gguf_serve.local.hub.server import LocalScope
from stacks.app import build_app, cli_context
from tests.catalog.stand_in import FILE, REPO, stand_in_gguf
from tests.conftest import ROOT
from tests.stacks.test_deploy_options import _cli_env

DOWN = "http://127.0.0.1:9"  # the discard port: nothing listens, a connection is refused at once
WHAT_TO_RUN = "`gguf-serve-catalog lock Qwen3.6-27B`"


def _lock_copy(folder: Path, *, drop: str | None = None, **typed_changes) -> Path:
    """The committed lock in `folder`, without `drop`'s entry or with the 27B's typed entry changed."""
    from dataclasses import replace

    entries = read_lock(ROOT / "profiles" / "models.lock.toml")
    entries.pop(drop or "", None)
    if typed_changes:
        entries["Qwen3.6-27B"] = replace(entries["Qwen3.6-27B"], **typed_changes)
    lock = folder / "models.lock.toml"
    lock.write_text(render_lock(entries))
    return lock


def _stand_in_sha256() -> str:
    gguf = stand_in_gguf()
    return gguf.with_name(gguf.name + ".sha256").read_text().split()[0]


def _errors(app, stack: str) -> list[str]:
    return [str(m.data) for m in app.node.find_child(stack).node.metadata if m.type == "aws:cdk:error"]


MOE_STACKS = ("GravitonMoeStack", "IntelMoeStack", "GravitonMoeHeadroomStack")


def test_hub_down_refuses_only_the_unlocked_stack_and_writes_nothing(tmp_path: Path, monkeypatch, capsys):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", DOWN)
    lock = _lock_copy(tmp_path)  # the committed lock: the 27B typed without a sha256
    before = lock.read_bytes()
    ctx = {**cli_context(), "modelLock": str(lock), "allowTypedLock": "true"}
    app = build_app(ctx, config_file=tmp_path / "absent.toml")
    (error,) = _errors(app, "GpuMtpStack")
    assert error.startswith("GpuMtpStack: cannot lock Qwen3.6-27B: ModelScope at http://127.0.0.1:9 is unreachable")
    assert WHAT_TO_RUN in error and "once, to pin the sha256 every instance verifies" in error and str(lock) in error
    for stack in MOE_STACKS:
        assert _errors(app, stack) == []  # the 35B's typed sha256 is used on purpose (allowTypedLock), said once
    (said,) = [line for line in capsys.readouterr().err.splitlines() if "Qwen3.6-35B-A3B's typed sha256" in line]
    assert "deploying it anyway (allowTypedLock = true)" in said
    assert lock.read_bytes() == before
    with pytest.raises(RuntimeError, match="GpuMtpStack: cannot lock Qwen3.6-27B"):
        app.synth()  # in one process cdk-nag's policy validation reports it for the whole app


@pytest.mark.parametrize("lookups", ["true", "false"])
def test_a_typed_sha256_nobody_checked_deploys_only_on_purpose(tmp_path: Path, monkeypatch, lookups):
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", DOWN)
    lock = _lock_copy(tmp_path)
    ctx = {**cli_context(), "modelLock": str(lock), "modelLookup": lookups}
    app = build_app(ctx, config_file=tmp_path / "absent.toml", stack_names=list(MOE_STACKS))
    for stack in MOE_STACKS:
        (error,) = _errors(app, stack)
        assert "Qwen3.6-35B-A3B's" in error and "typed" in error and "-c allowTypedLock=true" in error


def test_a_read_only_checkout_with_network_refuses_the_model_in_one_line(tmp_path: Path, monkeypatch):
    lock = _lock_copy(tmp_path, drop="Qwen3.6-27B")
    before = lock.read_bytes()
    # The write as a read-only mount answers it (file modes do not stop root, which the tests run as).
    monkeypatch.setattr("gguf_serve.catalog.lockfile._replace", _read_only)
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, stand_in_gguf())
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
        ctx = {**cli_context(), "modelLock": str(lock)}
        app = build_app(ctx, config_file=tmp_path / "absent.toml", stack_names=["GpuMtpStack"])
    (error,) = _errors(app, "GpuMtpStack")
    assert f"{lock} cannot be written (Read-only file system)" in error and "-c modelLock=" in error
    assert lock.read_bytes() == before


def _read_only(path: Path, text: str) -> None:
    import errno
    import os

    raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(path))


def test_a_typed_entry_that_agrees_is_upgraded_and_one_that_disagrees_refuses(tmp_path: Path, monkeypatch):
    sha, size = _stand_in_sha256(), stand_in_gguf().stat().st_size
    wrong = _lock_copy(tmp_path, sha256="f" * 64)
    (tmp_path / "ok").mkdir()
    agrees = _lock_copy(tmp_path / "ok", sha256=sha, size_bytes=size)
    before = wrong.read_bytes()
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, stand_in_gguf())
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", hub.url)
        ctx = {**cli_context(), "modelLock": str(wrong)}
        app = build_app(ctx, config_file=tmp_path / "absent.toml", stack_names=["GpuMtpStack"])
        build_app({**ctx, "modelLock": str(agrees)}, config_file=tmp_path / "absent.toml", stack_names=["GpuMtpStack"])
    (error,) = _errors(app, "GpuMtpStack")
    assert f"{wrong}: 'Qwen3.6-27B' is typed with sha256 {'f' * 64}" in error and f"gives sha256 {sha}" in error
    assert wrong.read_bytes() == before
    upgraded = read_lock(agrees)["Qwen3.6-27B"]
    assert (upgraded.locked_from, upgraded.sha256, upgraded.served_by) == ("listing", sha, hub.url[7:])
    assert upgraded.header["nextn_predict_layers"] == 1  # the file's own header now, not the typed facts


def test_synth_opens_no_socket_when_every_model_is_listing_locked(tmp_path: Path, monkeypatch):
    from gguf_serve.catalog.lookup import resolve_locks
    from tests.rehearsal import tiny_mtp

    lock = _lock_copy(tmp_path, drop="Qwen3.6-35B-A3B")
    with LocalScope() as hub:
        hub.add_file(REPO, FILE, stand_in_gguf())
        tiny = tiny_mtp.write(tmp_path / "tiny.gguf")  # any small MTP file: this test is about sockets, not sizes
        hub.add_file("unsloth/Qwen3.6-35B-A3B-MTP-GGUF", "Qwen3.6-35B-A3B-UD-Q4_K_M.gguf", tiny)
        done = resolve_locks(["Qwen3.6-27B", "Qwen3.6-35B-A3B"], root=ROOT / "profiles", lock_file=lock,
                             endpoint=hub.url)  # fmt: skip
    assert sorted(done.locked) == ["Qwen3.6-27B", "Qwen3.6-35B-A3B"]
    before = lock.read_bytes()
    opened = []

    def refuse(*args, **kwargs):
        opened.append(args)
        raise OSError("this test allows no network connection")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", DOWN)  # were a lookup attempted, it would be refused here, loudly
    context = {**cli_context(), "modelLock": str(lock), "sagemakerUnlistedTypes": "true"}  # every stack synthesizes
    app = build_app(context, config_file=tmp_path / "absent.toml")
    app.synth()
    assert opened == [] and lock.read_bytes() == before
    assert all(_errors(app, s) == [] for s in ("GpuMtpStack", "GravitonMoeStack", "IntelMoeStack"))


def _clone(tmp_path: Path, *stacks: str) -> Path:
    """The working tree as a fresh clone would have it (tracked and new files, nothing ignored), with the venv, and
    only the serving profiles of `stacks`: the CLI synthesizes every stack the app has, and these tests are about
    the lock, not the other stacks (the whole app through the CLI: test_deploy_options.py)."""
    names = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=ROOT, capture_output=True,
                           check=True).stdout.decode().split("\0")  # fmt: skip
    clone = tmp_path / "clone"
    for name in filter(None, names):
        src = ROOT / name
        if src.is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, clone / name)
    (clone / ".venv").symlink_to(ROOT / ".venv")
    for profile in (clone / "profiles" / "serving").glob("*.toml"):
        if tomllib.loads(profile.read_text()).get("stack") not in stacks:
            profile.unlink()
    return clone


def _cdk(tmp_path: Path, clone: Path, *args: str, hub: str) -> subprocess.CompletedProcess:
    """`npx cdk ...` as a user runs it in their clone (pinned CLI, no credentials), MODELSCOPE_ENDPOINT at `hub`."""
    env = {**_cli_env(tmp_path), "MODELSCOPE_ENDPOINT": hub}
    return subprocess.run(["npx", "--prefix", str(ROOT), "cdk", *args], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


@pytest.mark.cli
@pytest.mark.slow  # four CLI synths of one or two stacks
class TestTheRealCli:
    def test_a_clone_without_a_lock_locks_on_first_synth_and_goes_on(self, tmp_path: Path):
        clone = _clone(tmp_path, "GpuMtpStack")
        lock = _lock_copy(clone / "profiles", drop="Qwen3.6-27B")
        with LocalScope() as hub:
            hub.add_file(REPO, FILE, stand_in_gguf())
            out = _cdk(tmp_path, clone, "synth", "GpuMtpStack", "--quiet", "-o", str(tmp_path / "a"), hub=hub.url)
        said = out.stdout + out.stderr
        assert out.returncode == 0, said[-3000:]
        entry = read_lock(lock)["Qwen3.6-27B"]
        assert (entry.locked_from, entry.sha256, entry.endpoint) == ("listing", _stand_in_sha256(), hub.url)
        (line,) = [x for x in said.splitlines() if x.startswith("locked Qwen3.6-27B")]
        assert f"{entry.size_bytes:,} bytes, sha256 {entry.sha256}" in line and line.endswith("commit this file")
        assert (tmp_path / "a" / "GpuMtpStack.template.json").is_file()

    def test_hub_down_refuses_the_unlocked_stack_only(self, tmp_path: Path):
        clone = _clone(tmp_path, "GpuMtpStack", "GravitonMoeStack")
        lock = _lock_copy(clone / "profiles", drop="Qwen3.6-27B")  # no entry at all: nothing to plan from
        before = lock.read_bytes()
        refused = _cdk(tmp_path, clone, "synth", "GpuMtpStack", "--quiet", "-o", str(tmp_path / "b"), hub=DOWN)
        said = refused.stdout + refused.stderr
        assert refused.returncode != 0 and "Traceback" not in said
        assert "ModelScope at http://127.0.0.1:9 is unreachable" in said and WHAT_TO_RUN in said
        assert "once, to pin the sha256 every instance verifies" in said and lock.read_bytes() == before
        other = _cdk(tmp_path, clone, "synth", "GravitonMoeStack", "--quiet", "-o", str(tmp_path / "c"), hub=DOWN)
        said = other.stdout + other.stderr
        assert other.returncode != 0 and "-c allowTypedLock=true" in said  # the 35B is typed: on purpose only
        other = _cdk(tmp_path, clone, "synth", "GravitonMoeStack", "-c", "allowTypedLock=true", "--quiet", "-o",
                     str(tmp_path / "c"), hub=DOWN)  # fmt: skip
        assert other.returncode == 0, (other.stdout + other.stderr)[-3000:]
        assert "deploying it anyway (allowTypedLock = true)" in other.stdout + other.stderr

    def test_a_typed_entry_that_disagrees_refuses(self, tmp_path: Path):
        clone = _clone(tmp_path, "GpuMtpStack")
        lock = _lock_copy(clone / "profiles", sha256="f" * 64)
        before = lock.read_bytes()
        with LocalScope() as hub:
            hub.add_file(REPO, FILE, stand_in_gguf())
            out = _cdk(tmp_path, clone, "synth", "GpuMtpStack", "--quiet", "-o", str(tmp_path / "d"), hub=hub.url)
        said = out.stdout + out.stderr
        assert out.returncode != 0
        assert f"is typed with sha256 {'f' * 64}" in said and f"gives sha256 {_stand_in_sha256()}" in said
        assert "models.lock.toml" in said and lock.read_bytes() == before
