"""The application layer carries the runtime spec's loader, not the catalog: it must still serve and fetch.

The files are the ones the image build copies (stacks.image_build.app_files), in a folder of their own, run
by the launcher's own entry point with nothing of the checkout on the path: a module that reached for the
profiles or their data would fail here before it failed on an instance.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from gguf_serve.container.launch.preflight import EX_CONFIG
from stacks.image_build import ROOT, app_files
from tests.committed import PROFILES

GRAVITON = PROFILES["graviton-moe"]


def _layer(tmp_path: Path) -> Path:
    layer = tmp_path / "app"
    for path in app_files():
        target = layer / path.relative_to(ROOT)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, target)
    return layer


def _run(layer: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """As the image runs it: the layer and the third-party packages on the path, nothing of the checkout. -S: no
    site, so the venv's editable install of this checkout (a .pth file) cannot add the rest of the package."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("LLAMA_", "PYTHON"))}
    path = os.pathsep.join((str(layer), sysconfig.get_paths()["purelib"]))
    return subprocess.run(
        [sys.executable, "-P", "-S", *args], cwd=layer, capture_output=True, text=True, timeout=60,
        env={**clean, "PYTHONPATH": path, **(env or {})},
    )  # fmt: skip


def test_the_layer_holds_no_profile_data(tmp_path):
    layer = _layer(tmp_path)
    shipped = {p.name for p in (layer / "gguf_serve" / "container").iterdir() if p.is_file()}
    assert "spec.py" in shipped and not (layer / "profiles").exists()
    assert sorted(p.name for p in (layer / "gguf_serve").iterdir()) == ["__init__.py", "container"]
    entry_points = ", ".join(f"gguf_serve.container.{m}.cli" for m in ("launch", "fetch", "metrics", "hop"))
    out = _run(layer, "-c", f"import gguf_serve.container, {entry_points}; print(gguf_serve.container.__file__)")
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(layer)), "imported the checkout's package, not the layer's"
    assert _run(layer, "-c", "import gguf_serve.catalog").returncode != 0  # the catalog is not in the image at all


def test_the_layer_serves_from_a_runtime_spec(tmp_path, make_gguf, sentinel_binary):
    layer = _layer(tmp_path)
    binary, record = sentinel_binary
    model = make_gguf(GRAVITON.model.local_name, "qwen35moe")
    doc = json.loads(GRAVITON.runtime_json())
    spec = tmp_path / "runtime.json"
    serve = ("-m", "gguf_serve.container.launch", "serve", "--spec", str(spec), "--model-dir", str(model.parent))
    serve += ("--llama-server", str(binary))
    # The pinned size differs from the tiny file: refused with the reason, proof the whole check path ran.
    spec.write_text(json.dumps(doc))
    out = _run(layer, *serve, env={"LLAMA_API_KEY": "k"})
    assert out.returncode == EX_CONFIG and "different or damaged file" in out.stderr, out.stderr
    assert "Traceback" not in out.stderr and not record.exists()
    # Unpinned, the same file is accepted and llama-server is exec()ed with the spec's flags.
    doc["model"]["sha256"] = None
    spec.write_text(json.dumps(doc))
    out = _run(layer, *serve, env={"LLAMA_API_KEY": "k"})
    assert out.returncode == 0, out.stderr
    argv = record.read_text().split("---\n")[0].splitlines()
    assert argv[argv.index("--threads") + 1] == str(GRAVITON.threads)
    assert argv[argv.index("--ctx-size") + 1] == str(GRAVITON.server.ctx_total)
