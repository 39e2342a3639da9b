"""AMX is used only where a probe executes it: cpuid alone is never trusted (gguf_serve/container/launch/cpu.py).

A CPU can list amx_tile/amx_int8/amx_bf16 and still fault on ldtilecfg; these tests make the probe fail (or
pass) on whatever CPU runs them, with a cpuinfo file that lists AMX, and check that every consumer follows the
probe: the native build's compiler flags and cache key, and the launcher's llama-server argv.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from gguf_serve.container.launch import cpu
from gguf_serve.container.launch.serve import NO_EXTRA_BUFFERS, server_command

ROOT = Path(__file__).resolve().parents[2]
CPU_SCRIPT = ROOT / "gguf_serve" / "container" / "launch" / "cpu.py"
AMX_CPU = frozenset({"fpu", "sse2", "avx2", "avx512f", "amx_tile", "amx_int8", "amx_bf16"})
PLAIN_CPU = frozenset({"fpu", "sse2", "avx2"})


def cpuinfo_file(tmp_path: Path, flags: frozenset[str]) -> Path:
    path = tmp_path / "cpuinfo"
    path.write_text(f"processor\t: 0\nvendor_id\t: GenuineIntel\nflags\t\t: {' '.join(sorted(flags))}\n\n")
    return path


def fails(detail: str = "ldtilecfg killed the probe with signal 11"):
    return lambda: cpu.ProbeResult(False, detail)


def passes():
    return lambda: cpu.ProbeResult(True, "ran")


def test_cpuinfo_flags_are_read_from_the_flags_line(tmp_path):
    assert cpu.cpu_flags(cpuinfo_file(tmp_path, AMX_CPU)) == AMX_CPU
    (tmp_path / "arm").write_text("processor\t: 0\nFeatures\t: fp asimd sve i8mm bf16\n")
    assert cpu.cpu_flags(tmp_path / "arm") == {"fp", "asimd", "sve", "i8mm", "bf16"}
    assert cpu.cpu_flags(tmp_path / "missing") == frozenset()


def test_amx_follows_the_probe_not_cpuid():
    on = cpu.amx_plan(AMX_CPU, probe=passes())
    off = cpu.amx_plan(AMX_CPU, probe=fails())
    assert (on.advertised, on.usable, on.avoid) == (True, True, False)
    assert (off.advertised, off.usable, off.avoid) == (True, False, True)
    assert "AMX on" in on.line and "AMX off" in off.line and "signal 11" in off.line


def test_the_probe_is_not_run_where_cpuid_lists_no_amx():
    def must_not_run():
        raise AssertionError("probed a CPU without AMX")

    plan = cpu.amx_plan(PLAIN_CPU, probe=must_not_run)
    assert not plan.advertised and not plan.avoid and "no AMX" in plan.line


def test_a_faulting_instruction_is_caught_in_the_child():
    # ud2 raises SIGILL on every x86-64 CPU: what an AMX instruction does where the VM cannot execute it.
    if os.uname().machine != "x86_64":
        pytest.skip("x86-64 machine code")
    code = cpu._CHILD.replace(repr(cpu._AMX_CODE), repr(bytes.fromhex("0f0b")))
    assert code != cpu._CHILD
    result = cpu.probe_amx(code=code)
    assert not result.ok and "signal 4" in result.detail


def test_the_real_probe_agrees_with_a_cpu_without_amx(monkeypatch):
    # On a CPU whose cpuid has no AMX, the real probe (run regardless of cpuid) must not claim AMX works.
    monkeypatch.delenv(cpu.PROBE_OVERRIDE_ENV, raising=False)
    if {"amx_tile", "amx_int8"} & cpu.cpu_flags("/proc/cpuinfo"):
        pytest.skip("this CPU lists AMX: whether it executes is exactly what the probe decides")
    result = cpu.probe_amx()
    assert not result.ok, result


def test_override_forces_either_answer(monkeypatch):
    monkeypatch.setenv(cpu.PROBE_OVERRIDE_ENV, "fail")
    assert not cpu.probe_amx().ok
    monkeypatch.setenv(cpu.PROBE_OVERRIDE_ENV, "pass")
    assert cpu.probe_amx().ok


def fake_compiler(tmp_path: Path, answer: str) -> Path:
    """A `c++` whose output program prints `answer` ("kept" or "lost") as the tile-config probe would."""
    cxx = tmp_path / f"cxx-{answer}"
    cxx.write_text(
        '#!/bin/sh\nwhile [ "$1" != "-o" ]; do shift; done\n'
        f'printf \'#!/bin/sh\\necho {answer}\\n[ {answer} = kept ]\\n\' > "$2"; chmod +x "$2"\n'
    )
    cxx.chmod(0o755)
    return cxx


def test_native_build_compiles_amx_out_where_the_cpu_or_the_compiler_fails(tmp_path):
    kept = lambda: cpu.probe_compiler(str(fake_compiler(tmp_path, "kept")))  # noqa: E731
    lost = lambda: cpu.probe_compiler(str(fake_compiler(tmp_path, "lost")))  # noqa: E731
    assert cpu.native_build_cflags(cpu.amx_plan(AMX_CPU, probe=fails()), kept)[0] == list(cpu.NO_AMX_CFLAGS)
    assert cpu.native_build_cflags(cpu.amx_plan(AMX_CPU, probe=passes()), kept)[0] == []
    flags, line = cpu.native_build_cflags(cpu.amx_plan(AMX_CPU, probe=passes()), lost)
    assert flags == list(cpu.NO_AMX_CFLAGS) and "drops the tile config" in line and "compiled out" in line
    assert cpu.native_build_cflags(cpu.amx_plan(PLAIN_CPU), lost)[0] == []


def test_the_compiler_probe_finds_gcc_12s_tile_config_bug():
    """Debian 12's GCC 12.2 declares ldtilecfg's operand as 8 bytes: at -O3 ggml's tile config never reaches the CPU
    (the native build then died with SIGSEGV in ggml_backend_amx_mul_mat). Needs a CPU that executes AMX."""
    import re
    import shutil

    if shutil.which("g++") is None or os.uname().machine != "x86_64" or not cpu.probe_amx().ok:
        pytest.skip("needs g++ and a CPU that executes AMX")
    header = Path(subprocess.run(["g++", "-print-file-name=include/amxtileintrin.h"], capture_output=True,
                                 text=True, check=True).stdout.strip())  # fmt: skip
    narrow = re.search(r'ldtilecfg\\t%X0" :: "m" \(\*\(\(const void \*\*\)', header.read_text())
    result = cpu.probe_compiler("g++")
    assert result.ok is (narrow is None), (result, header)


def test_cache_key_covers_cpu_flags_probe_and_build_inputs():
    on = cpu.amx_plan(AMX_CPU, probe=passes())
    off = cpu.amx_plan(AMX_CPU, probe=fails())
    keys = {
        cpu.cache_tag(on, AMX_CPU, "flags A"),
        cpu.cache_tag(off, AMX_CPU, "flags A"),
        cpu.cache_tag(on, AMX_CPU | {"avx512_fp16"}, "flags A"),
        cpu.cache_tag(on, AMX_CPU, "flags B"),
    }
    assert len(keys) == 4
    assert cpu.cache_tag(on, AMX_CPU, "flags A") == cpu.cache_tag(on, frozenset(sorted(AMX_CPU)), "flags A")


def _script(tmp_path: Path, *args: str, probe: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        cpu.CPUINFO_ENV: str(cpuinfo_file(tmp_path, AMX_CPU)),
        cpu.PROBE_OVERRIDE_ENV: probe,
        **(env or {}),
    }
    return subprocess.run([sys.executable, str(CPU_SCRIPT), *args], capture_output=True, text=True, env=env, check=True)


def test_the_build_script_helper_runs_standalone_and_follows_the_probe(tmp_path):
    # scripts/build-llama-server.sh runs gguf_serve/container/launch/cpu.py as a file, with no package on the path.
    failed = _script(tmp_path, "build-flags", probe="fail")
    assert failed.stdout.split() == list(cpu.NO_AMX_CFLAGS) and "AMX off" in failed.stderr
    kept = {cpu.COMPILER_ENV: str(fake_compiler(tmp_path, "kept"))}
    assert _script(tmp_path, "build-flags", probe="pass", env=kept).stdout.strip() == ""
    lost = _script(tmp_path, "build-flags", probe="pass", env={cpu.COMPILER_ENV: str(fake_compiler(tmp_path, "lost"))})
    assert lost.stdout.split() == list(cpu.NO_AMX_CFLAGS) and "drops the tile config" in lost.stderr
    tags = {_script(tmp_path, "cache-tag", "x", probe=p).stdout.strip() for p in ("fail", "pass")}
    assert len(tags) == 2 and all(len(t) == 12 for t in tags)


def test_the_build_script_keys_its_cache_by_the_probe():
    text = (ROOT / "scripts" / "build-llama-server.sh").read_text()
    assert (
        'gguf_serve/container/launch/cpu.py" build-flags' in text
        and 'gguf_serve/container/launch/cpu.py" cache-tag' in text
    )
    assert '-DCMAKE_C_FLAGS="$cflags"' in text and '-$tag"' in text


def test_launcher_argv_gets_no_repack_only_where_amx_faults(tmp_path):
    from tests.committed import local_profile

    spec = local_profile(port=8099).runtime()
    base = server_command(spec, tmp_path / "m.gguf", "/bin/llama-server")
    faulting = server_command(spec, tmp_path / "m.gguf", "/bin/llama-server", amx=cpu.amx_plan(AMX_CPU, fails()))
    working = server_command(spec, tmp_path / "m.gguf", "/bin/llama-server", amx=cpu.amx_plan(AMX_CPU, passes()))
    assert faulting == [*base, NO_EXTRA_BUFFERS]
    assert working == base and NO_EXTRA_BUFFERS not in base


@pytest.mark.e2e
@pytest.mark.parametrize("probe", ["fail", "pass"])
def test_launcher_serves_with_the_choice_the_probe_made(probe, llama_server_binary, gemma_gguf, tmp_path, monkeypatch):
    """The real launcher and llama-server on a CPU said to list AMX: the log line and argv follow the probe."""
    from gguf_serve.local.process import free_port, start_server
    from tests.committed import local_profile

    monkeypatch.setenv(cpu.CPUINFO_ENV, str(cpuinfo_file(tmp_path, AMX_CPU)))
    monkeypatch.setenv(cpu.PROBE_OVERRIDE_ENV, probe)
    key = secrets.token_hex(16)
    with start_server(
        local_profile(port=free_port()), gemma_gguf.parent, binary=llama_server_binary, api_key=key, workdir=tmp_path
    ) as server:
        server.wait_healthy(timeout=120)
        log = server.log_path.read_text()
        import urllib.request

        req = urllib.request.Request(
            f"{server.url}/v1/chat/completions",
            data=json.dumps({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}).encode(),
            headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:  # noqa: S310 - loopback
            assert r.status == 200 and json.loads(r.read())["choices"]
    started = next(line for line in log.splitlines() if "starting llama-server" in line)
    if probe == "fail":
        assert "AMX off" in log and started.endswith(NO_EXTRA_BUFFERS)
    else:
        assert "AMX on" in log and NO_EXTRA_BUFFERS not in started


def test_the_no_amx_flags_win_over_march_whatever_their_order():
    # ggml compiles its AMX backend under __AMX_INT8__; CMake puts CMAKE_C_FLAGS before the target's
    # -march=native, and an explicit -mno-* must still hold (checked against a CPU that has AMX).
    import shutil

    if shutil.which("gcc") is None or os.uname().machine != "x86_64":
        pytest.skip("needs GCC for x86-64")
    flags, _ = cpu.native_build_cflags(cpu.amx_plan(AMX_CPU, fails()))

    def macros(*args: str) -> str:
        return subprocess.run(["gcc", *args, "-dM", "-E", "-"], input="", capture_output=True, text=True,
                              check=True).stdout  # fmt: skip

    assert "__AMX_INT8__" in macros("-march=sapphirerapids")
    assert "__AMX" not in macros(*flags, "-march=sapphirerapids")
