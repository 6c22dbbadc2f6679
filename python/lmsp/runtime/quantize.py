"""A model's weights written again in another type (``lmsp quantize``), by the engine's
own quantizer."""

from __future__ import annotations

import os
from typing import Any


def quantize_file(
    src: str | os.PathLike[str], dst: str | os.PathLike[str], kind: str, threads: int = 0
) -> dict[str, Any]:
    """Write ``src`` again to ``dst`` with its weights in ``kind`` (llama.cpp's name of
    the type, lower case: ``lmsp.native.QUANTIZE_TYPES``) on ``threads`` threads (0:
    one per core); the new file's GGUF metadata. ValueError, with the engine's
    message, for a type it does not know or a file it cannot read or write."""
    from .. import native  # the extension loads when it is needed only

    try:
        native.quantize(src, dst, kind, threads)
        return native.read_gguf_info(dst)
    except native.NativeError as exc:
        raise ValueError(str(exc)) from None
