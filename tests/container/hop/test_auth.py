"""The hop's API keys (gguf_serve/container/hop/auth.py): read like llama-server's LLAMA_API_KEY, from the instance's
env file, which the instance rewrites at every server start (a rotated key reaches the hop without a restart)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguf_serve.container.hop import cli
from gguf_serve.container.hop.auth import ApiKeys, needs_key

H = [(b"authorization", b"Bearer k1")]


def _write(path: Path, text: str, mtime_ns: int) -> None:
    with path.open("w") as f:  # rewritten in place, as the instance's key script does (a bind mount follows it)
        f.write(text)
    os.utime(path, ns=(mtime_ns, mtime_ns))


def test_a_rotated_key_is_read_again_and_an_empty_read_keeps_the_last(tmp_path: Path) -> None:
    env = tmp_path / "api.env"
    _write(env, "LLAMA_API_KEY=k1\n", 1_000_000_000)
    keys = ApiKeys(env_file=env, recheck_s=0)
    assert keys.accepts(H)
    _write(env, "", 2_000_000_000)  # caught between truncate and write
    assert keys.accepts(H)
    _write(env, "OTHER=x\nLLAMA_API_KEY=k2,k3\n", 3_000_000_000)
    assert not keys.accepts(H) and keys.accepts([(b"x-api-key", b"k3")])
    env.unlink()
    assert keys.accepts([(b"authorization", b"k2")])  # unreadable now: the keys read before still hold


def test_a_file_without_the_key_is_refused_at_start(tmp_path: Path) -> None:
    env = tmp_path / "api.env"
    env.write_text("NOT_THE_KEY=1\n")
    with pytest.raises(ValueError, match="has no LLAMA_API_KEY"):
        ApiKeys(env_file=env)
    with pytest.raises(ValueError, match="cannot read the API key file"):
        ApiKeys(env_file=tmp_path / "missing.env")


def test_comma_separated_keys_as_llama_server_takes_them() -> None:
    keys = ApiKeys.from_env("K", {"K": "a, b,,"})
    assert keys.keys == (b"a", b"b")
    with pytest.raises(ValueError, match="K is not set or empty"):
        ApiKeys.from_env("K", {"K": " , "})


@pytest.mark.parametrize(
    ("method", "route", "body", "needed"),
    [
        (b"POST", "/v1/chat/completions", True, True),
        (b"POST", "/health", True, False),
        (b"GET", "/v1/models", False, True),  # an API route: llama-server asks it for the key too (round 4)
        (b"GET", "/metrics", False, True),
        (b"GET", "/slots", False, True),
        (b"GET", "/props", False, True),
        (b"GET", "/index.html", False, False),  # a web UI asset: public in llama-server, forwarded
        (b"GET", "/v1/models", True, True),
        (b"DELETE", "/slots", False, True),
        (b"OPTIONS", "/v1/chat/completions", True, False),  # CORS preflight: llama-server never asks
    ],
)
def test_which_requests_the_hop_answers_without_the_key(method, route, body, needed) -> None:
    assert needs_key(method, route, body) is needed


def test_the_cli_takes_the_key_one_way(tmp_path: Path, capsys) -> None:
    env = tmp_path / "api.env"
    env.write_text("LLAMA_API_KEY=k\n")
    argv = ["--listen", "127.0.0.1:1", "--api-key-env-file", str(env), "--api-key-env", "LLAMA_API_KEY"]
    assert cli.main(argv) == 2
    assert "one way" in capsys.readouterr().err
    assert cli.main(["--listen", "127.0.0.1:1", "--api-key-env-file", str(tmp_path / "none")]) == 2
    assert "cannot read the API key file" in capsys.readouterr().err
