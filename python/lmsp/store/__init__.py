"""The durable store of LMSP chapter 11 on SQLite (see :class:`Store`)."""

from .db import StoreError
from .schema import SCHEMA_VERSION
from .states import (
    CANCELLED,
    CANCELLING,
    COMPLETED,
    FAILED,
    FINISHED,
    LOADING,
    QUEUED,
    RECOVERY,
    RUNNING,
    STATES,
    TRANSITIONS,
    UNFINISHED,
    ClaimLost,
)
from .idempotency import fingerprint
from .store import Store

__all__ = [
    "Store",
    "StoreError",
    "ClaimLost",
    "fingerprint",
    "SCHEMA_VERSION",
    "STATES",
    "TRANSITIONS",
    "RECOVERY",
    "UNFINISHED",
    "FINISHED",
    "QUEUED",
    "LOADING",
    "RUNNING",
    "CANCELLING",
    "COMPLETED",
    "FAILED",
    "CANCELLED",
]
