"""``engram import-bundle --reissue-ids``: records written before format 2 land re-addressed.

A format-1 record's id derives from its fleet, run, author and the plain SHA-256 of its text,
and its record_hash and its gate decision's ``content_hash`` cover that SHA-256: once it is
erased, a guess of the text can still be checked against them (docs/erasure.md, "Data written
before v2"). Imported with ``--reissue-ids``, each format-1 record becomes a format-2 record
(a new id of the same form, a salt, ``body_commitment``, the format-2 record_hash); each
format-1 tombstone a format-2 tombstone whose commitment opens to nothing (as an erased
format-2 record's, whose salt is gone). Everything that names them follows: other records'
``cross_refs`` and the ``shard:<id>`` in their text those came from (a live record naming
a derived id would keep it), a compaction summary's ``replaces`` list (ids and record
hashes), the gate decisions' record ids and content hashes, and the erasures' items and
record selectors. What names a record the bundle does not hold (a refused or lost write's
decision, an original retention removed) may be format 1 too, and nothing tells: its id and
hash are replaced by values derived under the key. Every rewritten item is sealed again and
the services re-check it as they would any import. Only a bundle of the whole fleet holds
every record its erasures and references name: a run's bundle is refused.

The new ids and salts are HMAC-SHA-256 of the old id under a key (``--reissue-ids KEYFILE``,
32 random bytes, made only with ``--new-reissue-key``), so running the import again gives the
same items and changes nothing. The key, and the id map the CLI can write, tie each new id to
the old one: keep them only until the import is complete and checked, then delete them.

The artifacts service's format-1 manifests, events and snapshots are re-addressed by
:mod:`engram.bundle.reissue_runs`, the compactor's format-1 warm lines by
:mod:`engram.bundle.reissue_lines`. Not re-addressed: decisions' request ids (a decision's id
derives from its request id).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle.format import BundleError, BundleReader, iteration_row
from engram.bundle.reissue_lines import IterationLines
from engram.bundle.reissue_runs import RunItems
from engram.governance.v1 import governance_service_pb2 as gpb
from engram.shard.v1 import shard_service_pb2 as spb
from services.shard.domain import records
from services.shard.domain.compaction import SUMMARY_SOURCE

KEY_BYTES = 32
_RECORD_KINDS = ("record", "summary")
_RECORD_REF = "record:"


def make_key(path: Path) -> None:
    """A new reissue key in ``path`` (which must not exist), readable by its owner only."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(KEY_BYTES) + "\n")
            out.flush()
            os.fsync(out.fileno())
    except FileExistsError:
        raise BundleError(f"{path} exists; --new-reissue-key makes a key only in a new file "
                          "(drop the flag to use the key it holds)") from None
    except OSError as error:
        raise BundleError(f"cannot make the reissue key {path}: {error.strerror}") from None


def load_key(path: Path) -> bytes:
    """The reissue key in ``path``: 64 hexadecimal digits in a file only its owner can read.
    A missing file is refused: a new key would give every record new ids again, so it is made
    only on request (:func:`make_key`)."""
    try:
        if path.stat().st_mode & 0o077:
            raise BundleError(f"{path} can be read or written by others; the reissue key ties "
                              f"the new ids to the old: chmod 600 {path}")
        text = path.read_bytes().decode("ascii").strip()
        key = bytes.fromhex(text)
    except FileNotFoundError:
        raise BundleError(f"no reissue key at {path}: pass --new-reissue-key to make one for "
                          "a first import; a re-run needs the key of the first") from None
    except OSError as error:
        raise BundleError(f"cannot read the reissue key {path}: {error.strerror}") from None
    except ValueError:  # not ASCII, or not hexadecimal
        key = b""
    if len(key) != KEY_BYTES:
        raise BundleError(f"{path} does not hold a reissue key ({KEY_BYTES * 2} hexadecimal "
                          "digits)")
    return key


class Reissue:
    """The re-addressing of one bundle's format-1 records and tombstones (``plan`` first)."""

    def __init__(self, key: bytes) -> None:
        self._key = key
        self.ids: dict[str, str] = {}
        """Old record id -> new, for every format-1 record and tombstone of the bundle."""
        self._hashes: dict[str, str] = {}
        """Old record_hash -> new, for every record and tombstone whose hash changes."""
        self._gate: dict[str, str] = {}
        """Old record id -> the content hash its gate decision holds now (a commitment)."""
        self._held: set[str] = set()
        """Every record id the bundle holds (records and tombstones)."""
        self.runs = RunItems(self._derive)
        """The artifacts service's manifests, events and snapshots."""
        self.lines = IterationLines(self._derive)
        """The compactor's warm lines."""

    def _derive(self, purpose: str, old_id: str) -> str:
        return hmac.new(self._key, f"engram-reissue-{purpose}\x1f{old_id}".encode(),
                        hashlib.sha256).hexdigest()

    def _new_id(self, record_id: str) -> str:
        """The id a format-1 record of the bundle gets, and one the bundle does not hold (a
        write refused or never stored, an original retention removed) named by a decision, a
        summary or an erasure: it may be format 1, and nothing tells, so it is replaced alike;
        nothing left can be checked against it."""
        return self._derive("id", record_id)[:records.ID_HEX_LEN]

    def _renamed_id(self, record_id: str) -> str:
        """A record id as anything naming it must now name it."""
        if record_id not in self._held:
            return self._new_id(record_id)
        return self.ids.get(record_id, record_id)

    def _renamed(self, record_id: str, record_hash: str) -> tuple[str, str]:
        """A record's id and record_hash as something naming both (an erasure item, a
        summary's ``replaces``) must now name them; derived under the key if not held."""
        leaf = (self._hashes.get(record_hash, record_hash) if record_id in self._held
                else self._derive("hash", record_hash))
        return self._renamed_id(record_id), leaf

    def plan(self, reader: BundleReader) -> None:
        """Reads the bundle's tombstones and records twice: their new ids first (a reference
        may name any of them), then their new hashes, in creation order (a summary names its
        originals' hashes, and they were written before it)."""
        for kind, message in (("tombstones", spb.RecordTombstone), ("records", spb.Record)):
            for item in reader.messages(kind, message):
                self._held.add(item.id)
                if (item.format or 1) == 1:
                    self.ids[item.id] = self._new_id(item.id)
        for tombstone in reader.messages("tombstones", spb.RecordTombstone):
            self.tombstone(tombstone, planning=True)
        for record in reader.messages("records", spb.Record):
            self.record(record, planning=True)
        for erasure in reader.messages("erasures", gpb.Erasure):  # read once for both
            self.runs.links.note_erasure(erasure)
            self.lines.links.note_erasure(erasure)
        self.runs.plan_manifests(reader.messages("manifests", apb.Manifest))
        self.runs.plan_events(reader.messages("events", apb.Event))
        self.runs.plan_snapshots(reader.messages("snapshots", apb.Snapshot))
        self.lines.plan(iteration_row(row) for row in reader.rows("iterations"))

    def record(self, message: spb.Record, *, planning: bool = False) -> spb.Record:
        """``message`` as it is imported: a format-1 record re-addressed, any record's
        references to re-addressed records renamed, in ``cross_refs`` and where its text names
        them (then hashed and sealed again)."""
        refs = [self._ref(ref) for ref in message.cross_refs]
        metadata = self._metadata(message)
        legacy = (message.format or 1) == 1
        if not legacy and refs == list(message.cross_refs) and metadata == message.metadata:
            return message
        # Imported here only: the shard's server modules are not needed to read a bundle.
        from services.shard.servicer import record_from_proto, record_to_proto

        content = message.content
        for before, after in zip(message.cross_refs, refs, strict=True):
            if before != after:  # the text names it (shard:<id>, in any case: ids are hex)
                content = re.sub(re.escape(before.removeprefix(_RECORD_REF)),
                                 after.removeprefix(_RECORD_REF), content, flags=re.IGNORECASE)
        record = replace(record_from_proto(message), cross_refs=tuple(refs), metadata=metadata,
                         content=content, content_hash=records.content_hash(content))
        if legacy:
            record = replace(record, id=self.ids[message.id], format=records.FORMAT,
                             salt=self._derive("salt", message.id))
        sealed = records.seal(record)
        if planning:
            self._hashes[message.record_hash] = sealed.record_hash
            self._gate[message.id] = records.gate_hash(sealed)
        return record_to_proto(sealed)

    def _ref(self, ref: str) -> str:
        """A cross-reference (``record:<id>`` or ``domain:<name>``) to a re-addressed record
        renamed."""
        if ref.startswith(_RECORD_REF):
            target = ref.removeprefix(_RECORD_REF)
            return _RECORD_REF + self.ids.get(target, target)
        return ref

    def _metadata(self, message: spb.Record) -> dict[str, str]:
        """A compaction summary's ``replaces`` list names each original by id and record_hash:
        both follow the originals (left as they are when the list does not parse; the shard
        judges it)."""
        metadata = dict(message.metadata)
        if message.source != SUMMARY_SOURCE or "replaces" not in metadata:
            return metadata
        try:
            replaced = json.loads(metadata["replaces"])
            renamed = [dict(zip(("id", "record_hash"),
                                self._renamed(str(item["id"]), str(item["record_hash"])),
                                strict=True))
                       for item in replaced]
        except (ValueError, TypeError, KeyError):
            return metadata
        if renamed != replaced:
            metadata["replaces"] = json.dumps(renamed, separators=(",", ":"))
        return metadata

    def tombstone(self, message: spb.RecordTombstone, *,
                  planning: bool = False) -> spb.RecordTombstone:
        """A format-1 tombstone becomes format 2: a new id and a commitment no salt opens
        (none was kept: the text is gone); any tombstone's references follow."""
        refs = [self._ref(ref) for ref in message.cross_refs]
        legacy = (message.format or 1) == 1
        if not legacy and refs == list(message.cross_refs):
            return message
        from services.shard.servicer import tombstone_from_proto, tombstone_to_proto

        tombstone = replace(tombstone_from_proto(message), cross_refs=tuple(refs))
        if legacy:
            tombstone = replace(tombstone, id=self.ids[message.id], format=records.FORMAT,
                                body_commitment=self._derive("commitment", message.id))
        leaf = hashlib.sha256(records.structural_fields(
            tombstone, tombstone.body_commitment)).hexdigest()
        tombstone = replace(tombstone, record_hash=leaf)
        if planning:
            self._hashes[message.record_hash] = leaf
            self._gate[message.id] = tombstone.body_commitment
        return tombstone_to_proto(tombstone)

    def decision(self, message: gpb.GateDecision) -> gpb.GateDecision:
        """A decision names the record it admitted and the hash it judged: both follow. One
        naming a record the bundle does not hold (refused, never stored, removed) gets an id
        and a hash derived under the key: its text is not here to commit to."""
        held = message.record_id in self._held
        if held and message.record_id not in self._gate:
            return message
        renamed = gpb.GateDecision()
        renamed.CopyFrom(message)
        if held:
            renamed.record_id = self.ids.get(message.record_id, message.record_id)
            renamed.content_hash = self._gate[message.record_id]
        else:
            renamed.record_id = self._new_id(message.record_id)
            renamed.content_hash = self._derive("commitment", message.content_hash)
        return renamed

    def erasure(self, message: gpb.Erasure) -> gpb.Erasure:
        """An erasure lists each record it erased by id and kept leaf, and an erasure of one
        record names it as its selector: all follow (one the bundle does not hold, alike)."""
        renamed = gpb.Erasure()
        renamed.CopyFrom(message)
        if renamed.selector_kind == "record":
            renamed.selector_value = self._renamed_id(renamed.selector_value)
        for item in renamed.items:
            if item.kind in _RECORD_KINDS:
                item.id, item.leaf_hash = self._renamed(item.id, item.leaf_hash)
            elif item.kind in ("iterations", "iteration"):
                self.lines.erased_item(item)
            else:
                self.runs.erased_item(item)
        return renamed

    def id_map(self) -> Iterator[dict[str, str]]:
        """Each re-addressed record's and manifest's old and new id."""
        renamed = {**self.ids, **self.runs.manifests}
        for old, new in sorted(renamed.items()):
            yield {"old": old, "new": new}
