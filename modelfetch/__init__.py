"""Model delivery: fetch a GGUF from the in-region S3 cache or ModelScope, verified and resumable.

`python -m modelfetch --help` documents the command line; docs/model-delivery.md the design.
"""

from modelfetch.gguf import GGUFError, has_mtp_layers, read_metadata

__all__ = ["GGUFError", "has_mtp_layers", "read_metadata"]
