"""What the hop lets one client hold, and how many slot-taking requests it admits (each a `gguf-serve-hop` flag)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Limits:
    """What one client can hold. Times in seconds, sizes in bytes."""

    max_body_bytes: int = 64 * 1024 * 1024  # larger request bodies get 413 (a long prompt is a few MiB of JSON)
    max_header_bytes: int = 32 * 1024  # request line and headers; more gets 431
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers
    body_timeout_s: float = 30.0  # between two pieces of a request body
    body_deadline_s: float = 120.0  # for a whole request body (64 MiB at 4.5 Mbit/s); then 408
    idle_timeout_s: float = 620.0  # keep-alive between requests: above the ALB's 600 s idle timeout
    send_timeout_s: float = 120.0  # a client that takes no bytes for this long is gone
    max_connections: int = 4096  # past it, the longest-idle connection is closed for the new one
    overflow_connections: int = 64  # past a full table of busy connections: these answer GET /health only
    connect_timeout_s: float = 5.0
    health_timeout_s: float = 0.5
    max_routed: int = 64  # requests forwarded to other models' fleets at once (models.py); past it 429


@dataclass(frozen=True)
class Admission:
    """Slot-taking requests in flight beyond slots * (1 + queue_per_slot) are shed with 429."""

    slots: int = 1
    queue_per_slot: int | None = None  # None: never shed
    retry_after_s: int = 2

    @property
    def limit(self) -> int | None:
        return None if self.queue_per_slot is None else self.slots * (1 + self.queue_per_slot)
