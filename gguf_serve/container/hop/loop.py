"""The hop's event loop, chosen here and nowhere else: uvloop's (libuv, in C) by default, asyncio's own on request.

Per streamed token the hop is one loop turn: the socket readable, a read, the SSE event checked, a write. On
asyncio's own loop that turn is half of the hop's instructions; uvloop runs the same code in about a third fewer
(tests/benchmarks/hop_cpu.py `--loop`, docs/observability.md). The image carries uvloop's wheel for its
architecture (docker/requirements-image.txt), `make` installs it from requirements.txt. A Python without it still
serves, on asyncio's loop, and says so once at start.

GGUF_SERVE_HOP_LOOP=asyncio picks asyncio's own loop (the benchmark's comparison; a suspected loop bug).
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

log = logging.getLogger("gguf-serve-hop")

LOOP_ENV = "GGUF_SERVE_HOP_LOOP"
LOOPS = ("uvloop", "asyncio")

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop]:
    """What makes the hop's loop: GGUF_SERVE_HOP_LOOP's choice, uvloop when it is unset."""
    chosen = os.environ.get(LOOP_ENV, "") or LOOPS[0]
    if chosen not in LOOPS:
        raise SystemExit(f"{LOOP_ENV}={chosen!r}: set it to one of {', '.join(LOOPS)}, or leave it unset (uvloop)")
    if chosen == "asyncio":
        return asyncio.new_event_loop
    try:
        import uvloop
    except ImportError as e:
        log.warning("uvloop does not import (%s): serving on asyncio's own loop, more CPU per token", e)
        return asyncio.new_event_loop
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """asyncio.run on the hop's loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)
