"""Model delivery: fetch a GGUF from the in-region S3 cache or ModelScope, verified and resumable.

`gguf-serve-fetch --help` documents the command line; docs/model-delivery.md the design.
Runtime dependencies: the standard library, urllib3 and boto3 (it runs inside the serving container).
"""

from gguf_serve.container.fetch.errors import AuthError, DiskSpaceError, FetchError, IntegrityError, NotFoundError
from gguf_serve.container.fetch.fetch import FetchResult, FileSpec, fetch_file, fetch_model
from gguf_serve.container.fetch.gguf import GGUFError, has_mtp_layers, read_metadata

__all__ = [
    "AuthError",
    "DiskSpaceError",
    "FetchError",
    "FetchResult",
    "FileSpec",
    "GGUFError",
    "IntegrityError",
    "NotFoundError",
    "fetch_file",
    "fetch_model",
    "has_mtp_layers",
    "read_metadata",
]
