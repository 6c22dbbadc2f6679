"""``metadata``: at most 16 string pairs (LMSP B.5), on responses, chat completions
and conversations; a wire type declares it as :data:`lmsp.wire.structs.Metadata`,
and :func:`parse_metadata` reads it alone."""

from __future__ import annotations

from typing import Any

from .structs import Body, Metadata, read


class MetadataField(Body):
    """``metadata``, read alone."""

    metadata: Metadata | None = None


def parse_metadata(value: Any) -> dict[str, str]:
    """``metadata`` (as JSON has it) as kept: a refused entry is named by its key."""
    return read({"metadata": value}, MetadataField).metadata or {}
