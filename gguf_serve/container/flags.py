"""The one function that turns a runtime spec into llama-server command-line flags."""

from __future__ import annotations

from gguf_serve.container.server import ALL_LAYERS
from gguf_serve.container.spec import RuntimeSpec


def llama_server_args(spec: RuntimeSpec, model_path: str, *, benchmark: bool = False) -> list[str]:
    """The llama-server command line for a runtime spec. The API key travels in LLAMA_API_KEY, never in argv."""
    s = spec.server
    args = [
        "--model", model_path,
        "--alias", spec.model.name,
        "--host", s.host,
        "--port", str(s.port),
        "--ctx-size", str(s.ctx_total),
        "--parallel", str(s.parallel),
        "--threads", str(spec.threads),
        "--n-gpu-layers", str(s.gpu_layers),
        "--cache-ram", "0" if benchmark else str(s.cache_ram_mib),
    ]  # fmt: skip
    if s.metrics:
        args.append("--metrics")
    if s.n_cpu_moe >= ALL_LAYERS:
        args.append("--cpu-moe")
    elif s.n_cpu_moe > 0:
        args += ["--n-cpu-moe", str(s.n_cpu_moe)]
    if s.speculative is not None:
        args += ["--spec-type", s.speculative.spec_type, "--spec-draft-n-max", str(s.speculative.draft_n_max)]
    return args
