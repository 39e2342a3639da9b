"""What this CPU can execute, probed rather than read from cpuid alone. Standard library only.

A machine can list `amx_tile amx_int8 amx_bf16` in cpuid, have XCR0 bits 17-18 set and answer
`arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA)` with 0, and still fault on `ldtilecfg` (a Firecracker VM: see
the project's findings). ggml trusts cpuid: a native build compiles its AMX matmul in, and the image's
`GGML_CPU_ALL_VARIANTS` loader picks the sapphirerapids variant, so llama-server dies with SIGSEGV at its
first matrix multiply. Here the AMX path is run for real, in a child process, before anything relies on it.

    python3 cpu.py describe      one line: what cpuid says, what the probe found, what is used
    python3 cpu.py build-flags   extra C/C++ flags for a native llama.cpp build on this machine
    python3 cpu.py cache-tag     a short hash of what a native build here is built for

The file runs as a script (the build script calls it before any virtual environment exists) and as
`gguf_serve.container.launch.cpu` in the image, where the launcher asks `amx_plan()` whether to pass `--no-repack`.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
import tempfile
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


# The compiler probe (native builds only): ggml's tile-config pattern (ggml-cpu/amx/mmq.cpp ggml_tile_config_init: a
# struct filled field by field, then _tile_loadconfig), compiled as the native build compiles (-O3 -march=native) and
# run: sttilecfg must give back what ldtilecfg loaded. GCC 12's amxtileintrin.h declares ldtilecfg's operand as
# 8 bytes (`*(const void **)__config`), so the optimizer drops the other 56 bytes' stores and ggml's first AMX
# matmul dies with SIGSEGV on a CPU whose AMX works (seen on these machines with Debian 12's GCC 12.2).
_TILECFG_PROBE = r"""
#include <immintrin.h>
#include <cstdint>
#include <cstdio>
#include <unistd.h>
#include <sys/syscall.h>
struct cfg_t { uint8_t palette_id = 0; uint8_t start_row = 0; uint8_t reserved_0[14] = {0};
               uint16_t colsb[16] = {0}; uint8_t rows[16] = {0}; };
__attribute__((noinline)) static void load() {
    alignas(64) cfg_t tc = {};
    tc.palette_id = 1;
    tc.rows[0] = 8;  tc.colsb[0] = 64; tc.rows[1] = 8;  tc.colsb[1] = 64;
    tc.rows[2] = 16; tc.colsb[2] = 32; tc.rows[3] = 16; tc.colsb[3] = 32;
    tc.rows[4] = 16; tc.colsb[4] = 64; tc.rows[5] = 16; tc.colsb[5] = 64;
    tc.rows[6] = 16; tc.colsb[6] = 64; tc.rows[7] = 16; tc.colsb[7] = 64;
    _tile_loadconfig(&tc);
}
int main() {
    syscall(158, 0x1023, 18);
    load();
    alignas(64) cfg_t out;
    _tile_storeconfig(&out);
    _tile_release();
    bool kept = out.palette_id == 1 && out.rows[0] == 8 && out.rows[7] == 16
                && out.colsb[2] == 32 && out.colsb[7] == 64;
    std::puts(kept ? "kept" : "lost");
    return kept ? 0 : 3;
}
"""
COMPILER_ENV = "CXX"  # the compiler the native build uses (CMake's default: c++)


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


def probe_compiler(cxx: str | None = None, timeout: float = 120.0) -> ProbeResult:
    """Compile ggml's tile-config pattern as the native build does and run it: the config must survive -O3."""
    cxx = cxx or os.environ.get(COMPILER_ENV) or "c++"
    with tempfile.TemporaryDirectory(prefix="amx-probe-") as tmp:
        src, exe = Path(tmp) / "tilecfg.cpp", Path(tmp) / "tilecfg"
        src.write_text(_TILECFG_PROBE)
        try:
            built = subprocess.run(  # noqa: S603 - the build's own compiler, fixed source
                [cxx, "-O3", "-march=native", str(src), "-o", str(exe)],
                capture_output=True, text=True, timeout=timeout, check=False,
            )  # fmt: skip
            if built.returncode != 0:
                return ProbeResult(False, f"{cxx} cannot compile AMX intrinsics")
            run = subprocess.run([str(exe)], capture_output=True, text=True, timeout=timeout, check=False)  # noqa: S603
        except (OSError, subprocess.TimeoutExpired) as e:
            return ProbeResult(False, f"compiler probe could not run ({type(e).__name__})")
    if run.returncode == 0 and run.stdout.strip() == "kept":
        return ProbeResult(True, f"{cxx} -O3 keeps the tile config")
    why = f"signal {-run.returncode}" if run.returncode < 0 else run.stdout.strip() or f"exit {run.returncode}"
    return ProbeResult(False, f"{cxx} -O3 drops the tile config's stores before ldtilecfg ({why})")


def native_build_cflags(plan: AmxPlan, compiler_probe=probe_compiler) -> tuple[list[str], str]:
    """Extra compiler flags for a -march=native build, and one line why: AMX compiled out where cpuid promises it
    falsely, or where the compiler miscompiles ggml's AMX tile configuration."""
    if plan.avoid:
        return list(NO_AMX_CFLAGS), plan.line
    if not plan.usable:
        return [], plan.line
    compiled = compiler_probe()
    if compiled.ok:
        return [], f"{plan.line}; {compiled.detail}"
    return list(NO_AMX_CFLAGS), f"{plan.line}, but {compiled.detail}: AMX compiled out of the native build"


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
        cflags, line = native_build_cflags(plan)
        print(line, file=sys.stderr)
        print(" ".join(cflags))
    elif command == "cache-tag":
        print(cache_tag(plan, extra=" ".join(argv[1:])))
    else:
        print(f"usage: {Path(__file__).name} describe|build-flags|cache-tag [extra]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
