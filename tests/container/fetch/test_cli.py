"""The command line: profile files, exit codes, the JSON summary, and the MTP guard."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

from gguf_serve.container.server import Speculative
from gguf_serve.local.hub import LocalScope
from tests.committed import GEMMA3_270M, local_profile
from tests.conftest import SMALL_FILE, SMALL_REPO
from tests.container.fetch.conftest import write_tiny_gguf

ROOT = Path(__file__).resolve().parents[3]


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gguf_serve.container.fetch", *args], cwd=ROOT, capture_output=True, text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
    )  # fmt: skip


def test_profile_file(gemma_hub: LocalScope, tmp_path: Path) -> None:
    profile = tmp_path / "runtime.json"
    profile.write_text(local_profile(model=GEMMA3_270M).runtime_json())
    p = _run("--spec", str(profile), "--dest", str(tmp_path / "m"), env={"MODELSCOPE_ENDPOINT": gemma_hub.url})
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)
    assert summary["sha256"] == GEMMA3_270M.sha256 and summary["source"] == "modelscope"
    assert (summary["architecture"], summary["nextn_predict_layers"], summary["has_mtp_layers"]) == ("gemma3", 0, False)
    assert "gguf-serve-fetch INFO" in p.stderr and "\r" not in p.stderr  # plain log lines when not on a terminal


def test_mtp_profile_on_a_file_without_mtp_layers_exits_3(gemma_hub: LocalScope, tmp_path: Path) -> None:
    lying = replace(GEMMA3_270M, has_mtp_layers=True)  # a catalog entry that claims MTP the file does not have
    profile = local_profile(model=lying).with_server(speculative=Speculative(), parallel=1)
    (tmp_path / "p.json").write_text(profile.runtime_json())
    p = _run("--spec", str(tmp_path / "p.json"), "--dest", str(tmp_path / "m"), "--endpoint", gemma_hub.url)
    assert p.returncode == 3, p.stderr
    assert "has no MTP layers" in p.stderr and "gemma3.nextn_predict_layers" in p.stderr
    assert (tmp_path / "m" / GEMMA3_270M.file).exists()  # the file itself is fine; the launcher must not use MTP


def test_require_mtp_with_explicit_file(hub: LocalScope, tmp_path: Path) -> None:
    repo = hub.root / "owner" / "tiny-GGUF"
    repo.mkdir(parents=True)
    write_tiny_gguf(repo / "mtp.gguf", "qwen35", 1)
    write_tiny_gguf(repo / "plain.gguf", "qwen35", 0)
    ok = _run("--repo", "owner/tiny-GGUF", "--file", "mtp.gguf", "--dest", str(tmp_path), "--endpoint", hub.url,
              "--require-mtp")  # fmt: skip
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["nextn_predict_layers"] == 1
    bad = _run("--repo", "owner/tiny-GGUF", "--file", "plain.gguf", "--dest", str(tmp_path), "--endpoint", hub.url,
               "--require-mtp")  # fmt: skip
    assert bad.returncode == 3 and json.loads(bad.stdout)["has_mtp_layers"] is False


def test_permanent_failure_exits_1_with_a_message(hub: LocalScope, small_file: tuple[Path, str],
                                                  tmp_path: Path) -> None:  # fmt: skip
    p = _run("--repo", SMALL_REPO, "--file", "nope.gguf", "--dest", str(tmp_path), "--endpoint", hub.url)
    assert p.returncode == 1 and p.stdout == ""
    assert f"nope.gguf is not in ModelScope repo {SMALL_REPO}" in p.stderr and SMALL_FILE in p.stderr


def test_bad_arguments_exit_2(tmp_path: Path) -> None:
    p = _run("--repo", "a/b", "--dest", str(tmp_path))
    assert p.returncode == 2 and "--repo and --file are required" in p.stderr
