"""One line of the pre-flight's table, and how a check reaches the account."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any


class Status(str, Enum):
    OK = "ok"
    WARN = "warn"
    BLOCKER = "BLOCKER"


@dataclass(frozen=True)
class Result:
    check: str
    status: Status
    detail: str
    todo: str = ""


Clients = Callable[[str], Any]  # service name -> boto3 client for the plan's region
