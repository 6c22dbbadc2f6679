"""Tensors of a safetensors file, read with numpy alone.

The format: an 8-byte little-endian length N, N bytes of JSON naming each
tensor's ``dtype``, ``shape`` and ``data_offsets`` (begin and end, in bytes,
from the end of the header), then the tensors' bytes. An optional
``__metadata__`` entry maps strings to strings. Arrays are mapped from the file,
not read into memory; a file whose header does not describe its bytes is
refused with one line.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import numpy as np

__all__ = ["SafetensorsError", "read_safetensors"]

MAX_HEADER = 100 << 20  # the format's own limit on the JSON header
# dtypes of the format that numpy holds as they are; BF16 is kept as its raw 16 bits
DTYPES: dict[str, np.dtype] = {
    "F64": np.dtype("<f8"),
    "F32": np.dtype("<f4"),
    "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"),
    "I32": np.dtype("<i4"),
    "I16": np.dtype("<i2"),
    "I8": np.dtype("i1"),
    "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class SafetensorsError(ValueError):
    """A file that is not a usable safetensors file: a one-line reason."""


def read_safetensors(path: os.PathLike[str] | str) -> dict[str, tuple[str, np.ndarray]]:
    """Every tensor of the file by name, as (its safetensors dtype, a read-only array mapped from the file)."""
    path = Path(path)
    size = path.stat().st_size
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise SafetensorsError(f"{path.name} is too short to be a safetensors file")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise SafetensorsError(f"{path.name} declares a header of {length} bytes; the file has {size}")
        try:
            header = json.loads(fh.read(length))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"{path.name} has no JSON header: {exc}") from None
    if not isinstance(header, dict):
        raise SafetensorsError(f"{path.name}: the header is not a JSON object")
    start = 8 + length
    out: dict[str, tuple[str, np.ndarray]] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, begin, end = _entry(path.name, name, entry)
        if begin < 0 or end > size - start or end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
            raise SafetensorsError(f"{path.name}: tensor {name} does not fit its offsets {begin}..{end}")
        array = (
            np.memmap(path, dtype=dtype, mode="r", offset=start + begin, shape=tuple(shape))
            if end > begin
            else (np.zeros(shape, dtype=dtype))
        )
        out[name] = (str(entry["dtype"]), array)
    return out


def _entry(file: str, name: str, entry: object) -> tuple[np.dtype, list[int], int, int]:
    if not isinstance(entry, dict):
        raise SafetensorsError(f"{file}: tensor {name} has no description")
    kind, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if kind not in DTYPES:
        raise SafetensorsError(f"{file}: tensor {name} has dtype {kind!r}, not one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
        raise SafetensorsError(f"{file}: tensor {name} has shape {shape!r}")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise SafetensorsError(f"{file}: tensor {name} has data_offsets {offsets!r}")
    return DTYPES[kind], shape, offsets[0], offsets[1]
