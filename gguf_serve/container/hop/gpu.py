"""GPU memory, temperature and utilization from the NVIDIA driver, through `nvidia-smi` (queried per scrape).

nvidia-smi ships with the driver, and the NVIDIA container toolkit mounts it into a container started with
GPU access (`utility` capability): no exporter image to pull from a registry that may be out of reach.
"""

from __future__ import annotations

import shutil
import subprocess

from gguf_serve.container.hop import names
from gguf_serve.container.hop.histogram import format_value

QUERY = "index,memory.used,memory.total,temperature.gpu,utilization.gpu"
MIB = 1024 * 1024


def query_command(binary: str) -> list[str]:
    return [binary, f"--query-gpu={QUERY}", "--format=csv,noheader,nounits"]


def parse_query(text: str) -> list[dict[str, float]]:
    """One dict per GPU line; a field nvidia-smi reports as [N/A] or [Not Supported] is left out."""
    gpus = []
    for line in text.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 5 or not fields[0].isdigit():
            continue
        gpu: dict[str, float] = {"index": float(fields[0])}
        for key, raw, scale in (
            ("memory_used", fields[1], MIB),
            ("memory_total", fields[2], MIB),
            ("temperature", fields[3], 1),
            ("utilization", fields[4], 0.01),
        ):
            try:
                gpu[key] = float(raw) * scale
            except ValueError:
                continue
        gpus.append(gpu)
    return gpus


def exposition(gpus: list[dict[str, float]]) -> str:
    families = (
        (names.GPU_MEMORY_USED, "memory_used", "GPU memory in use (bytes)"),
        (names.GPU_MEMORY_TOTAL, "memory_total", "GPU memory on the board (bytes)"),
        (names.GPU_TEMPERATURE, "temperature", "GPU core temperature (degrees Celsius)"),
        (names.GPU_UTILIZATION, "utilization", "Share of the last sample period a kernel ran on the GPU (0-1)"),
    )
    lines = []
    for name, key, help_text in families:
        rows = [g for g in gpus if key in g]
        if not rows:
            continue
        lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge"]
        lines += [f'{name}{{gpu="{int(g["index"])}"}} {format_value(g[key])}' for g in rows]
    return "\n".join(lines) + "\n" if lines else ""


class GpuReader:
    """Runs nvidia-smi when asked; `binary` None looks it up on PATH and stays silent when there is none."""

    def __init__(self, binary: str | None = None, timeout_s: float = 5.0) -> None:
        self.binary = binary or shutil.which("nvidia-smi")
        self.timeout_s = timeout_s
        self.last_error: str | None = None

    def exposition(self) -> str:
        if not self.binary:
            return ""
        try:
            out = subprocess.run(
                query_command(self.binary), capture_output=True, text=True, timeout=self.timeout_s, check=True
            ).stdout
        except (OSError, subprocess.SubprocessError) as e:
            self.last_error = f"{type(e).__name__}: {e}"
            return ""
        self.last_error = None
        return exposition(parse_query(out))
