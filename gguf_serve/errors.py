"""The one error a user can fix. Every bad input to synth and to the catalog's commands (a profile file, the lock
file, a deploy option, a construct's props) raises a subclass whose message is one line that says what to change;
each entry point catches `InputError` once and prints `error: <message>`, never a traceback."""

from __future__ import annotations


class InputError(ValueError):
    """Input that cannot work; the message says what to change, in one line."""
