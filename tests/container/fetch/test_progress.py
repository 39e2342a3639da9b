"""Progress: a redrawn bar on a terminal, throttled plain log lines otherwise."""

from __future__ import annotations

import io
import logging

import pytest

from gguf_serve.container.fetch.progress import Progress


def test_terminal_bar_redraws_one_line() -> None:
    out = io.StringIO()
    p = Progress("f.gguf", stream=out, tty=True)
    for done in (0, 50, 100):
        p.update(done, 100)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 3 and text.endswith("\n") and "100.0%" in text and "[" + "#" * 30 + "]" in text


def test_plain_lines_are_throttled(caplog: pytest.LogCaptureFixture) -> None:
    out = io.StringIO()
    p = Progress("f.gguf", stream=out, tty=False, log_every_s=3600)
    with caplog.at_level(logging.INFO, logger="gguf-serve-fetch"):
        for done in range(0, 101, 10):
            p.update(done, 100)
        p.update(100, 100)
    lines = [r.getMessage() for r in caplog.records]
    assert out.getvalue() == ""  # nothing drawn
    assert len(lines) == 2 and lines[0].startswith("f.gguf: 0 B of 100 B") and "(100.0%)" in lines[1]
