"""What can go wrong while fetching a model, split by what the caller should do about it."""

from __future__ import annotations


class FetchError(RuntimeError):
    """A permanent failure: retrying the same command will not help. The message says what to change."""


class NotFoundError(FetchError):
    """The repository, revision or file does not exist (HTTP 404)."""


class AuthError(FetchError):
    """The source refused us (HTTP 401/403): a private or gated repository, or a wrong token."""


class IntegrityError(FetchError):
    """The bytes did not match the expected size or sha256, even after downloading them again."""


class SizeMismatch(FetchError):
    """The source serves a different length than the listing said (a lying or changed listing)."""


class DiskSpaceError(FetchError):
    """The destination cannot hold the file."""


class TransientError(Exception):
    """A failure worth retrying with backoff: 5xx, 429, timeouts, resets, short bodies."""
