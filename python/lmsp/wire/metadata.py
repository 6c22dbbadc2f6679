"""``metadata``: at most 16 string pairs (LMSP B.5), on responses, chat completions
and conversations."""

from __future__ import annotations

from typing import Any

from lmsp.errors import InvalidRequest

MAX_METADATA = 16


def parse_metadata(value: Any) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidRequest("'metadata' must be an object of string values", param="metadata")
    if len(value) > MAX_METADATA:
        raise InvalidRequest(f"'metadata' has more than {MAX_METADATA} keys", param="metadata")
    for key, val in value.items():
        if not key or len(key) > 64:
            raise InvalidRequest("metadata keys are 1 to 64 characters", param=f"metadata.{key}")
        if not isinstance(val, str) or len(val) > 512:
            raise InvalidRequest("metadata values are strings of at most 512 characters", param=f"metadata.{key}")
    return dict(value)
