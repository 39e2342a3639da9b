"""Every kind of bad input to synth ends in one line that says what to change, never a traceback: a profile file,
the lock file, a deploy option and a construct's props, each through `stacks.app.main` (what app.py runs for
`cdk synth|deploy`, in-process), and the files through `gguf-serve-catalog check` too. The CLI around app.py:
test_deploy_options.py::TestTheRealCli::test_a_bad_option_fails_synth_in_one_line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.catalog.errors import ProfileError
from gguf_serve.errors import InputError
from stacks.app import build_app, main
from stacks.errors import PropsError
from stacks.options import DeployOptionError
from tests.conftest import ROOT, cdk_context

WAKE_FROM_ZERO = {"minCapacity": "0", "wakeOnRequest": "true", "warmPool": "0"}


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def _bad_profile(profiles: Path, lock: Path) -> dict:
    _edit(profiles / "serving" / "graviton-moe.toml", "parallel = 2", "parallel = 8")
    return {}


def _bad_lock(profiles: Path, lock: Path) -> dict:
    _edit(lock, 'sha256 = "a5fd3b62', 'sha256 = "not-a-hash')
    return {}


def _bad_option(profiles: Path, lock: Path) -> dict:
    return {"offHours": "8-8"}


def _bad_props(profiles: Path, lock: Path) -> dict:
    """Valid files and options that make a construct refuse its props: a cache this slow makes the wake-up of the
    27B (about 16 GiB, read at 2 MiB/s) longer than the wake door's longest Retry-After."""
    _edit(profiles / "serving" / "gpu-mtp.toml", "[fleet]\n", "[fleet]\ncache_read_mib_s = 2.0\n")
    return WAKE_FROM_ZERO


# kind: (how to make it, the error type, what the one line says)
KINDS = {
    "profile": (_bad_profile, ProfileError, "error: GravitonMoeStack: profile 'graviton-moe': Qwen3.6-35B-A3B needs"),
    "lock": (_bad_lock, ProfileError, "sha256: 'not-a-hash"),
    "option": (_bad_option, DeployOptionError, "error: offHours (from -c): '8-8': stop and start at the same hour"),
    "props": (_bad_props, PropsError, "error: WakeDoor: a wake-up of"),
}


@pytest.fixture
def inputs(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of profiles/ and of the tests' model lock, to break."""
    profiles = Path(shutil.copytree(ROOT / "profiles", tmp_path / "profiles"))
    lock = tmp_path / "models.lock.toml"
    shutil.copyfile(cdk_context()["modelLock"], lock)
    return profiles, lock


@pytest.mark.parametrize("kind", KINDS)
def test_synth_says_what_to_change_in_one_line(kind, inputs, tmp_path, capsys):
    make, error, says = KINDS[kind]
    profiles, lock = inputs
    # sagemakerUnlistedTypes: the SageMaker twins Ningxia does not host would add their own refusal lines
    context = {**cdk_context(), "modelLock": str(lock), "sagemakerUnlistedTypes": "true", **make(profiles, lock)}
    assert issubclass(error, InputError)
    assert main(context, config_file=tmp_path / "absent.toml", profiles_dir=profiles) == 1
    out = capsys.readouterr()
    # One line per refusal (a broken profile refuses its own stacks: the EC2 stack and its SageMaker twin); the
    # lines before them are synth's notes (a typed lock deployed on purpose: allowTypedLock).
    errors = [line for line in out.err.splitlines() if line.startswith("error: ")]
    assert errors and any(says in line for line in errors), out.err
    assert len(errors) == (2 if kind == "profile" else 1), out.err
    assert "Traceback" not in out.err + out.out


def test_the_copies_build_before_they_are_broken(inputs, tmp_path):
    """Negative control: the same copies, unbroken, with the props case's options, build the stack it breaks."""
    profiles, lock = inputs
    context = {**cdk_context(), "modelLock": str(lock), **WAKE_FROM_ZERO}
    app = build_app(context, config_file=tmp_path / "absent.toml", profiles_dir=profiles, stack_names=["GpuMtpStack"])
    assert app.node.find_child("GpuMtpStack").node.find_child("WakeDoor")


@pytest.mark.parametrize("kind", ["profile", "lock"])
def test_catalog_check_says_what_to_change_in_one_line(kind, inputs):
    make, _, says = KINDS[kind]
    profiles, lock = inputs
    make(profiles, lock)
    args = ["--profiles", str(profiles), "check", "--lock-file", str(lock)]
    out = subprocess.run([sys.executable, "-m", "gguf_serve.catalog", *args], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and out.stderr.startswith("error: "), out.stderr
    assert says.removeprefix("error: GravitonMoeStack: ") in out.stderr
