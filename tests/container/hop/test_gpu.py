"""GPU gauges from nvidia-smi's CSV query. The real nvidia-smi needs a GPU: here a script stands in for it
(the parsing and the exposition are what is tested; scripts/gpu-check.sh runs the real one)."""

from __future__ import annotations

import stat
from pathlib import Path

from gguf_serve.container.hop import names
from gguf_serve.container.hop.gpu import GpuReader, parse_query, query_command
from gguf_serve.container.metrics.prometheus import parse_prometheus

# nvidia-smi --query-gpu=index,memory.used,memory.total,temperature.gpu,utilization.gpu --format=csv,noheader,nounits
SAMPLE = "0, 20145, 24564, 67, 93\n1, 3, 12288, [N/A], [Not Supported]\n"


def test_parse_query_in_bytes_and_ratios() -> None:
    gpus = parse_query(SAMPLE)
    assert gpus[0] == {"index": 0, "memory_used": 20145 * 2**20, "memory_total": 24564 * 2**20,
                       "temperature": 67, "utilization": 0.93}  # fmt: skip
    assert "temperature" not in gpus[1] and gpus[1]["memory_total"] == 12288 * 2**20


def test_reader_runs_the_binary_and_exports_gauges(tmp_path: Path) -> None:
    fake = tmp_path / "nvidia-smi"
    fake.write_text(
        f'#!/bin/sh\n[ "$1" = "{query_command("x")[1]}" ] || exit 9\nprintf "{SAMPLE}"\n'.replace("\n", "\n")
    )
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    fam = parse_prometheus(GpuReader(str(fake)).exposition())
    assert fam[names.GPU_TEMPERATURE].value(gpu="0") == 67
    assert fam[names.GPU_TEMPERATURE].value(gpu="1") is None
    assert fam[names.GPU_MEMORY_USED].value(gpu="1") == 3 * 2**20
    assert fam[names.GPU_UTILIZATION].type == "gauge"


def test_reader_without_nvidia_smi_or_with_a_failing_one_exports_nothing(tmp_path: Path) -> None:
    assert GpuReader(str(tmp_path / "absent")).exposition() == ""
    failing = tmp_path / "nvidia-smi"
    failing.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2\nexit 9\n")
    failing.chmod(0o755)
    reader = GpuReader(str(failing))
    assert reader.exposition() == "" and "CalledProcessError" in (reader.last_error or "")
