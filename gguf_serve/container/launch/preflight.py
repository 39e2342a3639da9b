"""Checks that refuse a start llama-server would fail or misbehave on, before it is started."""

from __future__ import annotations

from pathlib import Path

from gguf_serve.container.fetch.gguf import GGUFError, summarize
from gguf_serve.container.spec import RuntimeSpec

EX_CONFIG = 78  # sysexits.h: a configuration error; the systemd unit should not restart on it


class LaunchRefused(Exception):
    """The runtime spec and the model file on disk cannot work together; the message says what to change."""


def check_model(spec: RuntimeSpec, model_dir: str | Path) -> Path:
    """The model file for `spec` in `model_dir`, after checking it is the file the spec expects."""
    model = spec.model
    path = Path(model_dir) / model.local_name
    if not path.is_file():
        raise LaunchRefused(
            f"model file {path} is missing: run `gguf-serve-launch fetch --spec ... --model-dir {model_dir}` "
            f"first (it downloads {model.repo}/{model.file})"
        )
    try:
        gguf = summarize(path)
    except (GGUFError, OSError) as e:
        raise LaunchRefused(f"{path} is not a readable GGUF file ({e}); delete it and fetch it again") from e
    if gguf.architecture != model.gguf_architecture:
        raise LaunchRefused(
            f"{path} is a {gguf.architecture!r} model but profile {spec.name!r} expects "
            f"{model.gguf_architecture!r} ({model.name}); fetch {model.repo}/{model.file} or pick the profile "
            "for this file"
        )
    if spec.mtp and not gguf.has_mtp_layers:
        raise LaunchRefused(
            f"profile {spec.name!r} asks for MTP speculative decoding ({spec.server.speculative.spec_type}) "
            f"but {path} has no MTP layers ({gguf.architecture}.nextn_predict_layers is 0), so llama-server would "
            f"exit; fetch the file from an *-MTP-GGUF repo ({model.repo}) or use a profile with MTP off"
        )
    if model.sha256 is not None and path.stat().st_size != model.size_bytes:
        raise LaunchRefused(
            f"{path} is {path.stat().st_size:,} bytes but {model.name} is {model.size_bytes:,} bytes "
            f"(sha256 {model.sha256[:12]}...); it is a different or damaged file: delete it and fetch again"
        )
    return path


def check_gpu(spec: RuntimeSpec, dev: Path = Path("/dev")) -> None:
    """A GPU profile without a visible NVIDIA device would run on the CPU, healthy and far too slow."""
    if spec.on_gpu and not any(dev.glob("nvidia[0-9]*")):
        raise LaunchRefused(
            f"profile {spec.name!r} puts {spec.server.gpu_layers} layers on the GPU but no NVIDIA device is "
            f"visible ({dev}/nvidia0): run the container with --gpus all on a host with the NVIDIA driver and "
            "container toolkit (llama-server would silently fall back to the CPU)"
        )
