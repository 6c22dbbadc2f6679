"""A GGUF file written whole or not at all: the writer works on a temporary file
beside the target, which is renamed into place only when everything was written
(the demo model, the converted embedding model)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def gguf_writer(path: Path, arch: str) -> Iterator[Any]:
    """A ``gguf.GGUFWriter`` for ``arch`` on a temporary file beside ``path``; the file
    becomes ``path`` when the block ends, and is removed when it raises."""
    import gguf

    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".part", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        try:
            yield writer
        finally:
            writer.close()
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
