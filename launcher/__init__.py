"""Turns a serving profile into a running llama-server: the same code in the container and on a laptop.

`python -m launcher serve` checks the GGUF against the profile, then exec()s llama-server with the catalog's
flags; `python -m launcher fetch` delivers the model; `python -m launcher.local` is the embedded default.
Runtime dependencies: the standard library, `catalog` and `modelfetch` (urllib3, boto3) only.
"""

from launcher.preflight import EX_CONFIG, LaunchRefused, check_gpu, check_model
from launcher.serve import server_command, server_environment

__all__ = ["EX_CONFIG", "LaunchRefused", "check_gpu", "check_model", "server_command", "server_environment"]
