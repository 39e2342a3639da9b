"""What this CPU can execute, probed rather than read from cpuid alone. Standard library only.

A machine can list `amx_tile amx_int8 amx_bf16` in cpuid, have XCR0 bits 17-18 set and answer
`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)` with 0, and still fault on `ldtilecfg` (a Firecracker VM: see
the project's findings). ggml trusts cpuid: a native build compiles its AMX matmul in, and the image's
`GGML_CPU_ALL_VARIANTS` loader picks the sapphirerapids variant, so llama-server dies with SIGSEGV at its
first matrix multiply. Here the AMX path is run for real, in a child process, before anything relies on it.

    python3 launcher/cpu.py describe      one line: what cpuid says, what the probe found, what is used
    python3 launcher/cpu.py build-flags   extra C/C++ flags for a native llama.cpp build on this machine
    python3 launcher/cpu.py cache-tag     a short hash of what a native build here is built for

The file runs as a script (the build script calls it before any virtual environment exists) and as
`launcher.cpu` in the image, where the launcher asks `amx_plan()` whether to pass `--no-repack`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

AMX_FLAGS = ("amx_tile", "amx_int8", "amx_bf16")
# GCC's switches for every AMX extension it knows; a native build with these compiles no AMX code
# (ggml's AMX backend is behind `__AMX_INT8__`, which -march=native would otherwise define).
NO_AMX_CFLAGS = ("-mno-amx-tile", "-mno-amx-int8", "-mno-amx-bf16")
# Set to "fail" or "pass" to force the probe's answer (tests, and a user who knows better than the probe).
PROBE_OVERRIDE_ENV = "GGUF_SERVE_AMX_PROBE"
# Read another cpuinfo file instead of /proc/cpuinfo (tests: a CPU that lists AMX, on one that has none).
CPUINFO_ENV = "GGUF_SERVE_CPUINFO"

# The probe, x86-64 System V, rdi = a 64-byte tile configuration (as assembled by GNU as):
#   push rdi; mov eax, 158 (arch_prctl); mov edi, 0x1023 (ARCH_REQ_XCOMP_PERM); mov esi, 18 (XTILEDATA)
#   syscall; pop rdi; test eax, eax; jnz done
#   ldtilecfg [rdi]; tilezero tmm0; tilerelease; xor eax, eax
#   done: ret
_AMX_CODE = bytes.fromhex("57b89e000000bf23100000be120000000f055f85c07511c4e2784907c4e27b49c0c4e27849c031c0c3")
# The child: map the code executable, call it with palette 1 and tile 0 = 16 rows x 64 bytes. It prints the
# syscall's result; a CPU that cannot execute the instructions kills it with SIGILL or SIGSEGV instead.
_CHILD = f"""
import ctypes, mmap
code = {_AMX_CODE!r}
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
fn = ctypes.CFUNCTYPE(ctypes.c_long, ctypes.c_void_p)(addr)
cfg = (ctypes.c_ubyte * 64)()
cfg[0] = 1
cfg[16] = 64
cfg[48] = 16
print(fn(ctypes.addressof(cfg)), flush=True)
"""


@dataclass(frozen=True)
class ProbeResult:
    ok: bool
    detail: str  # what happened, for the log line


@dataclass(frozen=True)
class AmxPlan:
    advertised: bool  # cpuid lists AMX
    usable: bool  # ... and the probe executed it
    line: str  # one log line: which and why

    @property
    def avoid(self) -> bool:
        """True when the AMX path must stay off: cpuid promises AMX that this machine cannot execute."""
        return self.advertised and not self.usable


def cpu_flags(cpuinfo: str | os.PathLike[str] | None = None) -> frozenset[str]:
    """The first processor's feature flags (x86 `flags`, arm64 `Features`); empty when unreadable."""
    cpuinfo = cpuinfo or os.environ.get(CPUINFO_ENV) or "/proc/cpuinfo"
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def probe_amx(python: str = sys.executable, timeout: float = 20.0, code: str = _CHILD) -> ProbeResult:
    """Execute ldtilecfg/tilezero/tilerelease in a child process; only a clean exit with 0 counts as usable."""
    forced = os.environ.get(PROBE_OVERRIDE_ENV, "").strip().lower()
    if forced in ("fail", "pass"):
        return ProbeResult(forced == "pass", f"forced by {PROBE_OVERRIDE_ENV}={forced}")
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return ProbeResult(False, f"not x86-64 ({platform.machine()})")
    try:
        run = subprocess.run(  # noqa: S603 - our own interpreter, fixed code
            [python, "-I", "-S", "-c", code], capture_output=True, text=True, timeout=timeout, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        return ProbeResult(False, f"probe could not run ({type(e).__name__})")
    if run.returncode < 0:
        return ProbeResult(False, f"ldtilecfg killed the probe with signal {-run.returncode}")
    if run.returncode != 0:
        last = (run.stderr.strip().splitlines() or ["no output"])[-1]
        return ProbeResult(False, f"probe exited {run.returncode}: {last}")
    if run.stdout.strip() != "0":
        return ProbeResult(False, f"arch_prctl(ARCH_REQ_XCOMP_PERM) refused tile data ({run.stdout.strip()})")
    return ProbeResult(True, "ldtilecfg, tilezero and tilerelease ran")


def amx_plan(flags: frozenset[str] | None = None, probe=probe_amx) -> AmxPlan:
    """Whether ggml's AMX path may run here, with one line that says which and why."""
    flags = cpu_flags() if flags is None else flags
    listed = [f for f in AMX_FLAGS if f in flags]
    if not listed:
        return AmxPlan(False, False, "cpu: no AMX in cpuid; ggml's AMX path is not used")
    result = probe()
    if result.ok:
        line = f"cpu: cpuid lists {' '.join(listed)} and the probe ran it ({result.detail}): AMX on"
        return AmxPlan(True, True, line)
    return AmxPlan(
        True,
        False,
        f"cpu: cpuid lists {' '.join(listed)} but the probe failed ({result.detail}): AMX off, "
        "llama-server gets --no-repack (prebuilt) or is compiled without AMX (native build)",
    )


def native_build_cflags(plan: AmxPlan) -> list[str]:
    """Extra compiler flags for a -march=native build: AMX compiled out where cpuid promises it falsely."""
    return list(NO_AMX_CFLAGS) if plan.avoid else []


def cache_tag(plan: AmxPlan, flags: frozenset[str] | None = None, extra: str = "") -> str:
    """12 hex digits naming what a native build here is built for: machine, CPU flags, probe result, extra.

    A cache carried to a CPU with other flags gets another tag, so it is rebuilt, never run into SIGILL.
    """
    flags = cpu_flags() if flags is None else flags
    h = hashlib.sha256()
    for part in (platform.machine(), " ".join(sorted(flags)), f"amx-usable={plan.usable}", extra):
        h.update(part.encode() + b"\0")
    return h.hexdigest()[:12]


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "describe"
    plan = amx_plan()
    if command == "describe":
        print(plan.line)
    elif command == "build-flags":
        print(plan.line, file=sys.stderr)
        print(" ".join(native_build_cflags(plan)))
    elif command == "cache-tag":
        print(cache_tag(plan, extra=" ".join(argv[1:])))
    else:
        print(f"usage: {Path(__file__).name} describe|build-flags|cache-tag [extra]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
