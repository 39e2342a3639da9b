"""The hop's event loop is chosen in one place (gguf_serve/container/hop/loop.py): uvloop's unless told otherwise,
asyncio's own where uvloop does not import, and a wrong choice refused with the ones there are."""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import pytest
import uvloop

from gguf_serve.container.hop import loop as hop_loop


def test_a_serving_hop_runs_on_uvloop_unless_asyncio_is_asked_for(hop):
    """The hop tests run on either loop (GGUF_SERVE_HOP_LOOP=asyncio for the whole folder): uvloop by default."""
    if os.environ.get(hop_loop.LOOP_ENV) == "asyncio":
        assert isinstance(hop._loop, asyncio.SelectorEventLoop)
    else:
        assert isinstance(hop._loop, uvloop.Loop)


def test_run_gives_the_coroutines_result_on_the_chosen_loop(monkeypatch):
    monkeypatch.delenv(hop_loop.LOOP_ENV, raising=False)

    async def which() -> type:
        return type(asyncio.get_running_loop())

    assert hop_loop.run(which()) is uvloop.Loop


def test_asyncio_loop_on_request(monkeypatch):
    monkeypatch.setenv(hop_loop.LOOP_ENV, "asyncio")
    loop = hop_loop.loop_factory()()
    try:
        assert isinstance(loop, asyncio.BaseEventLoop) and not isinstance(loop, uvloop.Loop)
    finally:
        loop.close()


def test_an_unknown_loop_is_refused_with_the_choices(monkeypatch):
    monkeypatch.setenv(hop_loop.LOOP_ENV, "trio")
    with pytest.raises(SystemExit, match=r"GGUF_SERVE_HOP_LOOP='trio': set it to one of uvloop, asyncio"):
        hop_loop.loop_factory()


def test_without_uvloop_the_hop_serves_on_asyncio_and_says_so(monkeypatch, caplog):
    monkeypatch.delenv(hop_loop.LOOP_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "uvloop", None)  # `import uvloop` raises ImportError
    with caplog.at_level(logging.WARNING, "gguf-serve-hop"):
        factory = hop_loop.loop_factory()
    assert factory is asyncio.new_event_loop
    assert "uvloop does not import" in caplog.text
