"""Container image targets: one Dockerfile each under docker/."""

from __future__ import annotations

from dataclasses import dataclass

from catalog.hardware import Architecture


@dataclass(frozen=True)
class ImageTarget:
    name: str
    architecture: Architecture
    accelerator: str | None  # "cuda" or None
    dockerfile: str  # relative to docker/


IMAGE_TARGETS: dict[str, ImageTarget] = {
    t.name: t
    for t in (
        ImageTarget("arm64-cpu", Architecture.ARM64, None, "arm64-cpu.Dockerfile"),
        ImageTarget("x86-64-cpu", Architecture.X86_64, None, "x86-64-cpu.Dockerfile"),
        ImageTarget("cuda", Architecture.X86_64, "cuda", "cuda.Dockerfile"),
    )
}
