"""One contract, every adapter: file:// on a temp dir and s3:// on moto in-process."""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest
from moto import mock_aws

from services.common.blobstore import BlobInfo, BlobStore, blob_store_from_url
from services.common.blobstore.file import FileBlobStore
from services.common.blobstore.s3 import S3BlobStore
from services.common.errors import AlreadyExists, InvalidArgument, NotFound
from tests.fsyncs import record_fsyncs
from tests.versioned_s3 import versioned_store

BUCKET = "engram-test"


@pytest.fixture(params=["file", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[BlobStore]:
    if request.param == "file":
        yield blob_store_from_url((tmp_path / "blobs").as_uri())
        return
    with mock_aws():
        boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=BUCKET)
        s3 = blob_store_from_url(f"s3://{BUCKET}/engram", region_name="us-east-1",
                                 access_key_id="test", secret_access_key="test")
        assert isinstance(s3, S3BlobStore)
        s3.part_size = 5 * 1024 * 1024
        s3.single_put_max = 5 * 1024 * 1024  # so the 11 MB blob below goes up in parts
        yield s3
        s3.close()


def _chunks(data: bytes, size: int = 64 * 1024) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def test_put_then_open_round_trips_bytes_and_hash(store: BlobStore) -> None:
    data = os.urandom(300_000)
    info = store.put("runs/r1/a.bin", _chunks(data))
    assert info.size_bytes == len(data)
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert b"".join(store.open("runs/r1/a.bin", chunk_size=4096)) == data
    assert store.exists("runs/r1/a.bin")


def test_multipart_sized_blob_streams_in_parts(store: BlobStore) -> None:
    data = os.urandom(11 * 1024 * 1024 + 17)
    info = store.put("runs/r1/big.bin", _chunks(data, 1 << 20))
    assert info.sha256 == hashlib.sha256(data).hexdigest()
    assert hashlib.sha256(b"".join(store.open("runs/r1/big.bin"))).hexdigest() == info.sha256


@pytest.mark.parametrize("size", [1000, 11 * 1024 * 1024 + 17], ids=["single", "multipart"])
def test_a_version_tells_a_put_from_another_put_at_the_same_key(store: BlobStore,
                                                                size: int) -> None:
    """An import checks under its run's lock that the blob at its key is still the one it put
    (a concurrent import of the same id may have replaced it): by version, not by reading it
    all again there."""
    first = store.put("runs/r1/v.bin", _chunks(os.urandom(size), 1 << 20))
    assert first.version is not None and store.version("runs/r1/v.bin") == first.version
    store.delete("runs/r1/v.bin")
    with pytest.raises(NotFound):
        store.version("runs/r1/v.bin")
    second = store.put("runs/r1/v.bin", _chunks(os.urandom(size), 1 << 20))
    assert store.version("runs/r1/v.bin") == second.version != first.version


def test_empty_blob(store: BlobStore) -> None:
    info = store.put("runs/r1/empty", iter(()))
    assert info.size_bytes == 0
    assert b"".join(store.open("runs/r1/empty")) == b""


def test_put_if_absent_refuses_to_replace(store: BlobStore) -> None:
    store.put("k/one", [b"first"])
    with pytest.raises(AlreadyExists):
        store.put("k/one", [b"second"])
    assert b"".join(store.open("k/one")) == b"first"


def test_before_commit_sees_the_blob_and_can_refuse_it(store: BlobStore) -> None:
    data = os.urandom(6 * 1024 * 1024 + 5)
    seen: list[BlobInfo] = []

    def refuse(info: BlobInfo) -> None:
        seen.append(info)
        raise InvalidArgument("declared hash differs")

    with pytest.raises(InvalidArgument):
        store.put("runs/r1/refused", _chunks(data, 1 << 20), before_commit=refuse)
    assert [(i.size_bytes, i.sha256) for i in seen] == [(len(data),
                                                        hashlib.sha256(data).hexdigest())]
    assert not store.exists("runs/r1/refused")
    assert list(store.list()) == []


def test_interrupted_put_leaves_nothing_visible(store: BlobStore) -> None:
    def failing() -> Iterator[bytes]:
        yield os.urandom(6 * 1024 * 1024)
        yield b"more"
        raise ConnectionResetError("client went away")

    with pytest.raises(ConnectionResetError):
        store.put("runs/r1/partial", failing())
    assert not store.exists("runs/r1/partial")
    assert list(store.list()) == []
    with pytest.raises(NotFound):
        store.open("runs/r1/partial")


@pytest.mark.parametrize(
    "key", ["", "../escape", "a/../../b", "/abs", "a//b", "a/./b", "a\\b", "ok/..", "nul\x00"]
)
def test_traversal_and_malformed_keys_are_refused(store: BlobStore, key: str) -> None:
    with pytest.raises(InvalidArgument):
        store.put(key, [b"x"])
    with pytest.raises(InvalidArgument):
        store.open(key)


def test_open_missing_is_not_found(store: BlobStore) -> None:
    with pytest.raises(NotFound):
        store.open("nope/missing")
    assert not store.exists("nope/missing")


def test_delete_is_idempotent(store: BlobStore) -> None:
    store.put("d/x", [b"x"])
    store.delete("d/x")
    store.delete("d/x")
    assert not store.exists("d/x")


def test_list_is_sorted_and_filtered_by_prefix(store: BlobStore) -> None:
    for key in ("runs/b/2", "runs/a/1", "runs/a/0", "other/z"):
        store.put(key, [key.encode()])
    assert list(store.list("runs/a/")) == ["runs/a/0", "runs/a/1"]
    assert list(store.list()) == ["other/z", "runs/a/0", "runs/a/1", "runs/b/2"]
    assert list(store.list("runs/a")) == ["runs/a/0", "runs/a/1"]
    assert list(store.list("runs/none/")) == []
    assert list(store.list("nowhere/at/all/")) == []


def test_file_store_lists_a_prefix_without_walking_the_rest(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # FindIterationLogs lists each run's files: a walk of every fleet's blobs per run let one
    # fleet's many runs cost the whole store each (a tenant's denial of service).
    store = FileBlobStore(tmp_path / "blobs")
    for key in ("fleet-a/run-1/x", "fleet-b/run-2/y"):
        store.put(key, [b"z"])
    walked: list[str] = []
    walk = os.walk

    def recorded(top: str | os.PathLike[str], *args: Any, **kwargs: Any) -> Any:
        walked.append(str(top))
        return walk(top, *args, **kwargs)

    monkeypatch.setattr(os, "walk", recorded)
    assert list(store.list("fleet-a/run-1/")) == ["fleet-a/run-1/x"]
    assert walked == [str((tmp_path / "blobs" / "fleet-a" / "run-1").resolve())]


def test_file_store_refuses_symlink_escape(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "blobs" / "link").symlink_to(outside)
    with pytest.raises(InvalidArgument):
        store.put("link/evil", [b"x"])
    assert not any(outside.iterdir())


def test_file_store_reserved_tmp_dir_is_not_a_key(tmp_path: Path) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    with pytest.raises(InvalidArgument):
        store.put(".tmp/x", [b"x"])


def test_registry_rejects_unknown_scheme() -> None:
    with pytest.raises(InvalidArgument, match="unsupported blob store URL"):
        blob_store_from_url("ftp://host/dir")


def test_s3_url_without_bucket_is_refused() -> None:
    with pytest.raises(InvalidArgument):
        blob_store_from_url("s3:///prefix")


def test_file_store_fsyncs_every_directory_a_put_created(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = FileBlobStore(tmp_path / "blobs")
    synced = record_fsyncs(monkeypatch)
    root = store.root
    store.put("runs/r1/s1/blob", [b"x"])
    dirs = {p for p in synced if p.is_dir()}
    assert dirs == {root, root / "runs", root / "runs/r1", root / "runs/r1/s1"}
    synced.clear()
    store.put("runs/r1/s2/blob", [b"y"])  # only s2 is new: its parent r1 and s2 itself
    assert {p for p in synced if p.is_dir()} == {root / "runs/r1", root / "runs/r1/s2"}


def test_a_put_after_a_failed_put_fsyncs_every_directory_up_to_the_root(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Found by review: a put that failed after its mkdir (ENOSPC on link) left directories
    never synced into their parents; the next put found them existing and synced only its own
    directory, so a power loss could drop them with the blobs acknowledged under them. A new
    store (a restart after a killed put) does not trust them either."""
    store = FileBlobStore(tmp_path / "blobs")
    root = store.root

    def no_space(*_args: object, **_kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched:
        patched.setattr(os, "link", no_space)
        with pytest.raises(OSError):
            store.put("runs/r1/s1/blob", [b"x"])
    assert (root / "runs/r1/s1").is_dir() and not store.exists("runs/r1/s1/blob")

    synced = record_fsyncs(monkeypatch)
    every = {root, root / "runs", root / "runs/r1", root / "runs/r1/s1"}
    store.put("runs/r1/s1/blob", [b"x"])
    assert {p for p in synced if p.is_dir()} == every
    synced.clear()
    store.put("runs/r1/s1/other", [b"y"])  # the ancestors are known synced now
    assert {p for p in synced if p.is_dir()} == {root / "runs/r1/s1"}
    synced.clear()
    FileBlobStore(root).put("runs/r1/s1/third", [b"z"])  # a new process knows nothing
    assert {p for p in synced if p.is_dir()} == every


def test_purge_leaves_nothing_and_is_idempotent(store: BlobStore) -> None:
    store.put("runs/r/a.txt", [b"erase me"])
    store.put("runs/r/ab.txt", [b"keep me"])
    store.purge("runs/r/a.txt")
    store.purge("runs/r/a.txt")
    assert not store.exists("runs/r/a.txt")
    assert list(store.list("runs/")) == ["runs/r/ab.txt"]


def test_purge_on_a_versioned_bucket_removes_every_version() -> None:
    """A plain delete on a versioned bucket only hides the bytes behind a delete marker."""
    with versioned_store(BUCKET) as (client, s3):
        s3.put("runs/r/a.txt", [b"first secret"])
        s3.delete("runs/r/a.txt")  # a delete marker over version 1
        client.put_object(Bucket=BUCKET, Key="engram/runs/r/a.txt", Body=b"second secret")
        client.put_object(Bucket=BUCKET, Key="engram/runs/r/a.txt.other", Body=b"kept")
        s3.purge("runs/r/a.txt")
        left = client.list_object_versions(Bucket=BUCKET, Prefix="engram/runs/r/")
        keys = [v["Key"] for v in [*left.get("Versions", []), *left.get("DeleteMarkers", [])]]
        assert keys == ["engram/runs/r/a.txt.other"]


class _RecordedDeletes:
    """The store's S3 client, recording the version each delete_object names (None: none)."""

    def __init__(self, client: Any) -> None:
        self.client, self.versions = client, []

    def delete_object(self, **kwargs: Any) -> Any:
        self.versions.append(kwargs.get("VersionId"))
        return self.client.delete_object(**kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.client, name)


def test_purge_sends_no_plain_delete_after_the_sweep() -> None:
    """On real S3 (not moto) a plain delete of a versioned key adds a delete marker named by the
    key, even when no version is left: sent after the sweep, it left one behind, and an
    artifact's key holds its name (found by review)."""
    with versioned_store(BUCKET) as (client, s3):
        s3.put("runs/r/a-secret-name.txt", [b"one"])
        client.put_object(Bucket=BUCKET, Key="engram/runs/r/a-secret-name.txt", Body=b"two")
        recorded = _RecordedDeletes(s3.client)
        s3._client = recorded
        s3.purge("runs/r/a-secret-name.txt")
        assert recorded.versions[0] is None and None not in recorded.versions[1:]
        assert len(recorded.versions) >= 3  # the plain delete, then both versions (and marker)
        left = client.list_object_versions(Bucket=BUCKET, Prefix="engram/runs/r/")
        assert not left.get("Versions") and not left.get("DeleteMarkers")


def test_parts_a_killed_put_left_are_removed_when_the_store_opens(tmp_path: Path) -> None:
    """Found by review (2026-11-30): a put killed mid-way (SIGKILL during an upload) left its
    part in .tmp for good. A part idle past STALE_PART_SECONDS goes when a store opens the
    directory; a recent one may be another process's put in progress and stays."""
    import time

    from services.common.blobstore.file import STALE_PART_SECONDS

    FileBlobStore(tmp_path)
    dead, live = tmp_path / ".tmp" / "dead.part", tmp_path / ".tmp" / "live.part"
    for part in (dead, live):
        part.write_bytes(b"x" * 1024)
    old = time.time() - STALE_PART_SECONDS - 60
    os.utime(dead, (old, old))
    FileBlobStore(tmp_path)
    assert not dead.exists() and live.exists()


def test_a_key_with_a_control_character_stored_before_stays_readable_and_erasable(
        tmp_path: Path) -> None:
    """New keys refuse control characters (validate_new_key: S3's XML listings cannot carry
    them); keys stored before the rule are still opened, checked and purged (a review of the
    first version found every access to them refused, an erasure of their run included)."""
    from services.common.blobstore import validate_new_key

    store = FileBlobStore(tmp_path)
    key = "fleets/f/runs/r/s/a1/note\r.txt"
    with pytest.raises(InvalidArgument):
        validate_new_key(key)
    store.put(key, [b"kept from before"])
    assert b"".join(store.open(key)) == b"kept from before" and store.exists(key)
    store.purge(key)
    assert not store.exists(key)
