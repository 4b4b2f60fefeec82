"""The bundle file: round trip, a time-independent digest, and every way of tampering named."""

from __future__ import annotations

import hashlib
import io
import json
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from engram.bundle import format as format_module
from engram.bundle.format import (
    MANIFEST_PATH,
    MAX_HEADER_BYTES,
    SPOOL_BYTES,
    BundleError,
    BundleReader,
    BundleWriter,
    Manifest,
    Member,
)

BLOB = b"tool output\n" * 100
BLOB_SHA = hashlib.sha256(BLOB).hexdigest()


def write_bundle(out: Path, rows: int = 3) -> Manifest:
    with BundleWriter(out, "fleet-a") as bundle:
        with bundle.part("records") as part:
            for i in range(rows):
                part.write({"id": f"r{i}", "content": f"memory {i} é", "n": i})
        with bundle.part("domains") as part:
            part.write({"name": "technical", "keywords": ["api"]})
        bundle.add_blob(BLOB_SHA, io.BytesIO(BLOB))
    return bundle.manifest


def rewrite(source: Path, target: Path, change) -> None:  # type: ignore[no-untyped-def]
    """Copies a bundle member by member through ``change(info, data) -> [(info, data)]``."""
    with tarfile.open(source) as old, tarfile.open(target, "w", format=tarfile.PAX_FORMAT) as new:
        for info in old.getmembers():
            handle = old.extractfile(info)
            data = handle.read() if handle else b""
            for out_info, out_data in change(info, data):
                out_info.size = len(out_data)
                new.addfile(out_info, io.BytesIO(out_data))


def problems_of(path: Path) -> list[str]:
    with BundleReader(path) as reader, pytest.raises(BundleError) as failure:
        reader.verify()
    return failure.value.problems or [str(failure.value)]


def test_round_trip_reads_back_every_row_and_blob(tmp_path: Path) -> None:
    out = tmp_path / "fleet.bundle"
    written = write_bundle(out)
    assert not (tmp_path / "fleet.bundle.partial").exists()
    with BundleReader(out) as reader:
        manifest = reader.verify()
        assert manifest.content_digest == written.content_digest
        assert manifest.rows("records") == 3
        assert [r["id"] for r in reader.rows("records")] == ["r0", "r1", "r2"]
        assert list(reader.rows("events")) == []
        assert reader.blob(BLOB_SHA).read() == BLOB


def test_same_content_gives_the_same_bytes_and_digest(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    write_bundle(tmp_path / "b")
    assert (tmp_path / "a").read_bytes() == (tmp_path / "b").read_bytes()
    write_bundle(tmp_path / "c", rows=4)
    with BundleReader(tmp_path / "a") as a, BundleReader(tmp_path / "c") as c:
        assert a.verify().content_digest != c.verify().content_digest


def test_rows_are_refused_before_verify(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    with BundleReader(tmp_path / "a") as reader, pytest.raises(BundleError, match="verify"):
        list(reader.rows("records"))


def test_a_large_blob_spools_to_disk_and_round_trips(tmp_path: Path) -> None:
    big = bytes(range(256)) * ((SPOOL_BYTES // 256) + 3)
    with BundleWriter(tmp_path / "big", "f") as bundle:
        bundle.add_blob(hashlib.sha256(big).hexdigest(), io.BytesIO(big))
    with BundleReader(tmp_path / "big") as reader:
        reader.verify()
        assert hashlib.sha256(reader.blob(hashlib.sha256(big).hexdigest()).read()).digest() \
            == hashlib.sha256(big).digest()


def test_a_blob_that_does_not_match_its_name_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="not written"), \
            BundleWriter(tmp_path / "x", "f") as bundle:
        bundle.add_blob("0" * 64, io.BytesIO(b"other"))
    assert not (tmp_path / "x").exists() and not (tmp_path / "x.partial").exists()


def test_a_failed_export_leaves_no_bundle(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), BundleWriter(tmp_path / "x", "f") as bundle:
        with bundle.part("records") as part:
            part.write({"id": "r0"})
        raise RuntimeError("interrupted")
    assert list(tmp_path.iterdir()) == []


def test_an_altered_part_is_named(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [
        (info, data.replace(b"memory 1", b"memory X") if info.name.endswith("records.jsonl")
         else data)])
    problems = problems_of(tmp_path / "b")
    assert len(problems) == 1 and problems[0].startswith("parts/records.jsonl was altered")


def test_an_altered_blob_is_named(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [
        (info, data[:-1] + b"!" if info.name.startswith("blobs/") else data)])
    problems = problems_of(tmp_path / "b")
    assert len(problems) == 1 and problems[0].startswith(f"blobs/{BLOB_SHA} was altered")


def test_missing_added_and_repeated_members_are_each_named(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")

    def change(info: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
        if info.name == "parts/domains.jsonl":
            return []  # missing
        if info.name == "parts/records.jsonl":
            extra = tarfile.TarInfo("parts/extra.jsonl")
            return [(info, data), (info, data), (extra, b"{}\n")]  # repeated, added
        return [(info, data)]

    rewrite(tmp_path / "a", tmp_path / "b", change)
    problems = problems_of(tmp_path / "b")
    assert "parts/records.jsonl is repeated in the bundle" in problems
    assert "parts/domains.jsonl is missing (listed in MANIFEST.json)" in problems
    assert "parts/extra.jsonl was added (not in MANIFEST.json)" in problems


@pytest.mark.parametrize("name", ["../evil.jsonl", "/etc/passwd", "parts/../../x", "parts//x"])
def test_a_member_outside_the_bundle_is_named(tmp_path: Path, name: str) -> None:
    write_bundle(tmp_path / "a")
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [
        (info, data), *([(tarfile.TarInfo(name), b"x")] if info.name == MANIFEST_PATH else [])])
    problems = problems_of(tmp_path / "b")
    assert any(p.startswith(repr(name)) and "bundle" in p for p in problems), problems


def test_a_link_member_is_refused(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    link = tarfile.TarInfo("parts/link.jsonl")
    link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [
        (info, data), *([(link, b"")] if info.name == MANIFEST_PATH else [])])
    assert any("not a regular file" in p for p in problems_of(tmp_path / "b"))


def test_a_manifest_edited_to_match_is_caught_by_its_digest(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")

    def change(info: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
        if info.name != MANIFEST_PATH:
            return [(info, data)]
        document = json.loads(data)
        document["members"][0]["size"] += 1
        return [(info, json.dumps(document).encode())]

    rewrite(tmp_path / "a", tmp_path / "b", change)
    assert "content_digest" in problems_of(tmp_path / "b")[0]


def test_no_manifest_is_not_a_bundle(tmp_path: Path) -> None:
    write_bundle(tmp_path / "a")
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [] if info.name == MANIFEST_PATH
            else [(info, data)])
    assert "MANIFEST.json is missing" in problems_of(tmp_path / "b")


def test_a_file_that_is_not_a_tar_is_refused(tmp_path: Path) -> None:
    (tmp_path / "junk").write_bytes(b"not a tar at all" * 100)
    with pytest.raises(BundleError, match="not a readable bundle"):
        BundleReader(tmp_path / "junk")


def test_a_sparse_member_is_refused_without_reading_its_holes(tmp_path: Path) -> None:
    """A pax GNU sparse member of 10 bytes in the file claiming 1 PiB (its holes read as
    zeros) is named, and verify hashes no more than the bundle holds."""
    blob = b"x" * 10
    sha = hashlib.sha256(blob).hexdigest()
    manifest = Manifest(fleet_id="fleet-a", members=[Member(f"blobs/{sha}", 10, sha)])
    out = tmp_path / "sparse.bundle"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(f"blobs/{sha}")
        info.size = len(blob)
        info.pax_headers = {"GNU.sparse.map": "0,10", "GNU.sparse.size": str(1 << 50)}
        tar.addfile(info, io.BytesIO(blob))
        data = manifest.to_bytes()
        info = tarfile.TarInfo(MANIFEST_PATH)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    hashed: list[int] = []

    def progress(n: int) -> None:
        hashed.append(n)
        assert sum(hashed) <= out.stat().st_size, f"hashed {sum(hashed)} bytes"

    with BundleReader(out) as reader, pytest.raises(BundleError) as failure:
        reader.verify(progress)
    assert any("sparse member" in p for p in failure.value.problems), failure.value.problems


def test_a_member_of_another_size_than_listed_is_not_read(tmp_path: Path) -> None:
    """A member whose tar size is not the manifest's is named before a byte of it is hashed."""
    out, edited = tmp_path / "a.bundle", tmp_path / "b.bundle"
    written = write_bundle(out)
    rewrite(out, edited, lambda info, data: [
        (info, data + b"more\n" if info.name == "parts/records.jsonl" else data)])
    hashed: list[int] = []
    with BundleReader(edited) as reader, pytest.raises(BundleError) as failure:
        reader.verify(hashed.append)
    assert any(p.startswith("parts/records.jsonl was altered") for p in failure.value.problems)
    assert sum(hashed) == sum(m.size for m in written.members
                              if m.path != "parts/records.jsonl")


def _bundle_with_header(out: Path, pax: dict[str, str], name: str = "parts/domains.jsonl",
                        fmt: int = tarfile.PAX_FORMAT) -> None:
    data = b"{}\n"
    manifest = Manifest(fleet_id="fleet-a", members=[
        Member(name, len(data), hashlib.sha256(data).hexdigest(), 1)]).to_bytes()
    with tarfile.open(out, "w", format=fmt) as tar:
        for path, content, headers in ((name, data, pax), (MANIFEST_PATH, manifest, {})):
            info = tarfile.TarInfo(path)
            info.size = len(content)
            info.pax_headers = headers
            tar.addfile(info, io.BytesIO(content))


def test_a_huge_pax_header_is_refused_before_it_is_read(tmp_path: Path) -> None:
    """tarfile reads an extended header whole into memory: one over 64 KiB (the writer makes
    none) is refused before it is read, with memory far below its size."""
    out = tmp_path / "pax.bundle"
    _bundle_with_header(out, {"comment": "c" * (32 << 20)})
    refused, peak = _reader_peak(out)
    assert re.search(r"pax extended header of \d+ bytes, over", refused), refused
    assert peak < 4 << 20, f"peak {peak / 1e6:.0f} MB"


def test_a_huge_gnu_long_name_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "gnu.bundle"
    _bundle_with_header(out, {}, name="parts/" + "a" * (MAX_HEADER_BYTES + 10),
                        fmt=tarfile.GNU_FORMAT)
    with pytest.raises(BundleError, match=r"GNU long name of \d+ bytes, over"):
        BundleReader(out)


def test_a_global_pax_header_is_refused(tmp_path: Path) -> None:
    """A global header's values are copied onto every later member: no bundle has one."""
    out = tmp_path / "global.bundle"
    data = b"{}\n"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT, pax_headers={"k": "v"}) as tar:
        info = tarfile.TarInfo("parts/domains.jsonl")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with pytest.raises(BundleError, match="global pax header"):
        BundleReader(out)


def test_a_bundle_with_too_many_members_is_refused(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(format_module, "MAX_MEMBERS", 2)
    out = tmp_path / "fleet.bundle"
    write_bundle(out)  # three parts and blobs, and the manifest
    with pytest.raises(BundleError, match="more than 2 members"):
        BundleReader(out)


def test_a_deeply_nested_line_is_a_bundle_error(tmp_path: Path) -> None:
    """json.loads raises RecursionError on a line nested too deep: named, not a traceback."""
    line = b'{"name":' + b"[" * 200_000 + b"]" * 200_000 + b"}\n"
    out = tmp_path / "deep.bundle"
    manifest = Manifest(fleet_id="fleet-a", members=[
        Member("parts/domains.jsonl", len(line), hashlib.sha256(line).hexdigest(), 1)])
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for path, content in (("parts/domains.jsonl", line), (MANIFEST_PATH, manifest.to_bytes())):
            info = tarfile.TarInfo(path)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
    with BundleReader(out) as reader:
        reader.verify()
        with pytest.raises(BundleError, match=r"parts/domains\.jsonl line 1 is not JSON"):
            list(reader.rows("domains"))


def test_a_deeply_nested_manifest_is_a_bundle_error(tmp_path: Path) -> None:
    data = b'{"format":' + b"[" * 30_000 + b"]" * 30_000 + b"}"  # within the size bound
    out = tmp_path / "deep-manifest.bundle"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        info = tarfile.TarInfo(MANIFEST_PATH)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    with BundleReader(out) as reader, pytest.raises(BundleError, match="not a bundle manifest"):
        reader.verify()


def _relabelled(source: Path, target: Path, recompute: bool, **fields: str) -> None:
    """A copy whose manifest names another fleet or run; with ``recompute`` its
    content_digest is made again for the new fields (what a forger does)."""
    def change(info: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
        if info.name != MANIFEST_PATH:
            return [(info, data)]
        document = json.loads(data)
        document.update(fields)
        if recompute:
            document["content_digest"] = Manifest(
                fleet_id=document["fleet_id"], run_id=document["run_id"],
                members=[Member(m["path"], m["size"], m["sha256"], m.get("rows"))
                         for m in document["members"]]).content_digest
        return [(info, json.dumps(document).encode())]

    rewrite(source, target, change)


@pytest.mark.parametrize("fields", [{"fleet_id": "fleet-b"}, {"run_id": ""},
                                    {"run_id": "run-9"}])
def test_the_digest_covers_the_fleet_and_run_the_manifest_names(
        tmp_path: Path, fields: dict[str, str]) -> None:
    """Before format 2 a copy relabelled to another fleet (or from one run to the whole
    fleet) kept its content_digest, so `import-bundle --expect` let it into the other fleet."""
    out = tmp_path / "run.bundle"
    with BundleWriter(out, "fleet-a", "run-1") as bundle, bundle.part("domains") as part:
        part.write({"name": "technical"})
    original = bundle.manifest.content_digest
    _relabelled(out, tmp_path / "plain.bundle", False, **fields)
    assert "was altered" in problems_of(tmp_path / "plain.bundle")[0]
    _relabelled(out, tmp_path / "forged.bundle", True, **fields)
    with BundleReader(tmp_path / "forged.bundle") as reader:
        assert reader.verify().content_digest != original


def test_a_row_of_another_fleet_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "mixed.bundle"
    with BundleWriter(out, "fleet-b") as bundle, bundle.part("rules") as part:
        part.write({"fleet_id": "fleet-b", "id": "kept"})
        part.write({"fleet_id": "fleet-a", "id": "smuggled"})
    with BundleReader(out) as reader:
        reader.verify()
        rows = reader.rows("rules")
        assert next(rows)["id"] == "kept"
        with pytest.raises(BundleError, match="line 2 is of fleet 'fleet-a', not the bundle's "
                                              "'fleet-b'"):
            next(rows)


def test_a_format_1_bundle_still_reads(tmp_path: Path) -> None:
    """Bundles written before format 2 keep their digest (members only) and import."""
    out = tmp_path / "old.bundle"
    write_bundle(out)

    def change(info: tarfile.TarInfo, data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
        if info.name != MANIFEST_PATH:
            return [(info, data)]
        document = json.loads(data)
        digest = hashlib.sha256(b"engram-bundle/1\n")
        for member in sorted(document["members"], key=lambda m: m["path"]):
            digest.update(format_module.canonical_line(member))
        document.update(format="engram-bundle/1", content_digest=digest.hexdigest())
        return [(info, json.dumps(document).encode())]

    rewrite(out, tmp_path / "format1.bundle", change)
    with BundleReader(tmp_path / "format1.bundle") as reader:
        manifest = reader.verify()
        assert manifest.format == "engram-bundle/1"
        assert [r["id"] for r in reader.rows("records")] == ["r0", "r1", "r2"]


def test_a_manifest_larger_than_its_members_need_is_refused_unparsed(tmp_path: Path) -> None:
    """A review (2026-11-29) made a 267 MB manifest of 6.5 M made-up entries: parsing it took
    2.9 GB before the digest was compared. A manifest is bounded by its bundle's members."""
    write_bundle(tmp_path / "a")
    rewrite(tmp_path / "a", tmp_path / "b", lambda info, data: [
        (info, data + b" " * 200_000 if info.name == MANIFEST_PATH else data)])
    with BundleReader(tmp_path / "b") as reader, pytest.raises(
            BundleError, match=r"over the 69632 a manifest of a bundle of 4 members may have"):
        reader.verify()


def test_the_reader_keeps_no_tar_header_of_its_members(tmp_path: Path) -> None:
    """tarfile keeps every TarInfo it reads, each with its pax headers (up to 64 KiB): a
    bundle of 8000 members with 60 KB headers held 535 MB before a byte was verified."""
    out = tmp_path / "pax.bundle"
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        for i in range(400):
            info = tarfile.TarInfo(f"parts/x{i}.jsonl")
            info.pax_headers = {"comment": "p" * 60_000}
            tar.addfile(info, io.BytesIO(b""))
    refused, peak = _reader_peak(out, members=400)
    assert not refused
    assert peak < 4 * 1024 * 1024, peak  # 400 x 60 KB is 24 MB when the headers are kept


_READER_PEAK = """
import json, sys, tracemalloc
from engram.bundle.format import BundleError, BundleReader
tracemalloc.start()
refused = ""
try:
    with BundleReader(sys.argv[1]) as reader:
        assert len(reader._infos) == int(sys.argv[2]) and not reader._tar.members
except BundleError as error:
    refused = str(error)
print(json.dumps([refused, tracemalloc.get_traced_memory()[1]]))
"""


def _reader_peak(bundle: Path, members: int = 0) -> tuple[str, int]:
    """(the BundleError opening ``bundle`` raised, or ""; the peak of traced memory), measured
    in a process of its own: tracemalloc counts every thread's allocations, and a thread
    another test left in this worker once took a peak of 0.3 MB to 8 MB (CI, 2026-11-30)."""
    measured = subprocess.run([sys.executable, "-c", _READER_PEAK, str(bundle), str(members)],
                              check=True, capture_output=True, text=True, timeout=120)
    refused, peak = json.loads(measured.stdout)
    return str(refused), int(peak)


def test_an_unexpected_digest_is_refused_before_a_member_is_hashed(tmp_path: Path) -> None:
    """`import-bundle --expect` was compared after every member was hashed (minutes for a
    large bundle, and a hostile manifest parsed first)."""
    out = tmp_path / "a"
    written = write_bundle(out)
    hashed: list[int] = []
    with BundleReader(out) as reader, pytest.raises(BundleError, match="not the 0000"):
        reader.verify(hashed.append, expect_digest="0" * 64)
    assert hashed == []
    with BundleReader(out) as reader:
        assert reader.verify(hashed.append, written.content_digest).content_digest == \
            written.content_digest
    assert hashed
