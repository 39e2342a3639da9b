"""The one error a construct raises for props that cannot work (checked before anything is built)."""

from __future__ import annotations

from gguf_serve.errors import InputError


class PropsError(InputError):
    """A construct's props that cannot work; the message names the construct and says what to change."""
