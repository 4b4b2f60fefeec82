"""``--reissue-ids`` for the artifacts service's items: format-1 manifests, events and
snapshots re-addressed (see :mod:`engram.bundle.reissue`).

A format-1 manifest's id is ``mf_`` and SHA-256 of its content, its ``content_hash`` that
SHA-256; a format-1 event's hash covers its payload, a format-1 snapshot's ``state_hash`` is
the SHA-256 of its state. Each becomes format 2 (a salt derived under the key, a commitment):
a manifest gets a new id of the same form, an event's link covers its payload's commitment,
and since every later link of the run covers the one before, the run's chain is derived again
from its first changed event on (a format-2 event erased in place keeps its commitment and
gets its new link). Events and snapshots naming a re-addressed manifest follow, as do the
erasures' event, snapshot, manifest and run items (a run's leaf is its head). What an
erasure lists that the bundle does not hold (a run erased whole, a manifest erased) may be
format 1 and nothing tells: its leaf, and a manifest's id, are replaced by values derived
under the key.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from engram.artifacts.v1 import artifacts_service_pb2 as apb
from engram.bundle.reissue_chain import ChainLinks, Derive
from engram.governance.v1 import governance_service_pb2 as gpb
from services.artifacts.domain import chain
from services.common.commitment import commitment

M = TypeVar("M", apb.Manifest, apb.Event, apb.Snapshot)


def _copy(message: M) -> M:
    copy = type(message)()
    copy.CopyFrom(message)
    return copy


class RunItems:
    """Plans (``plan_*``, in the bundle's order) and rewrites one bundle's run items."""

    def __init__(self, derive: Derive) -> None:
        self._derive = derive
        self.manifests: dict[str, str] = {}
        """Old manifest id -> new, for every format-1 manifest of the bundle."""
        self._held_manifests: set[str] = set()
        self._manifest_hashes: dict[str, str] = {}
        """Old content_hash -> new, for every format-1 manifest (an erasure's manifest leaf)."""
        self.links = ChainLinks(derive, ("event", "snapshot", "run"))
        """Each run's event chain (an event's or snapshot's leaf, a run's head)."""

    # -- planning (memory: the manifests, the erasures' leaves, one link a run) ----------

    def plan_manifests(self, manifests: Iterable[apb.Manifest]) -> None:
        for manifest in manifests:
            self._held_manifests.add(manifest.manifest_id)
            if (manifest.format or 1) == 1:
                self.manifests[manifest.manifest_id] = self._manifest_id(manifest.manifest_id)
                self._manifest_hashes[manifest.content_hash] = \
                    self.manifest(manifest).content_hash

    def plan_events(self, events: Iterable[apb.Event]) -> None:
        for event in events:
            self.links.planned(event.hash, self.event(event).hash)
        self.links.end_pass()

    def plan_snapshots(self, snapshots: Iterable[apb.Snapshot]) -> None:
        for snapshot in snapshots:
            if self.links.lists(snapshot.state_hash):  # none else is named by its leaf
                self.links.planned(snapshot.state_hash, self.snapshot(snapshot).state_hash)

    # -- rewriting ----------------------------------------------------------------

    def _manifest_id(self, old: str) -> str:
        return "mf_" + self._derive("manifest", old)[:40]

    def _renamed_manifest(self, manifest_id: str) -> str:
        if not manifest_id or manifest_id in self._held_manifests:
            return self.manifests.get(manifest_id, manifest_id)
        return self._manifest_id(manifest_id)  # erased or never here: it may be format 1

    def manifest(self, message: apb.Manifest) -> apb.Manifest:
        if (message.format or 1) != 1:
            return message
        renamed = _copy(message)
        renamed.manifest_id = self.manifests[message.manifest_id]
        renamed.format = chain.FORMAT
        renamed.salt = self._derive("manifest-salt", message.manifest_id)
        renamed.content_hash = commitment(renamed.salt, message.content_json.encode())
        return renamed

    def event(self, message: apb.Event) -> apb.Event:
        """The event with its manifest renamed, format 2, linked to its predecessor's new
        link (a pass gives each run's events in order, as the bundle holds them)."""
        prev = (chain.GENESIS if message.seq <= 1
                else self.links.prev(message.run_id, message.seq, message.prev_hash))
        manifest_id = self._renamed_manifest(message.manifest_id)
        legacy = (message.format or 1) == 1
        if not legacy and prev == message.prev_hash and manifest_id == message.manifest_id:
            self.links.linked(message.run_id, message.seq, message.hash)
            return message
        renamed = _copy(message)
        renamed.manifest_id = manifest_id
        renamed.prev_hash = prev
        if legacy:  # never erased in place: its payload is here
            renamed.format = chain.FORMAT
            renamed.salt = self._derive("event-salt", f"{message.run_id}:{message.seq}")
            renamed.payload_commitment = chain.payload_commitment(renamed.salt,
                                                                  message.payload_json)
        renamed.hash = chain.event_hash_v2(
            prev_hash=prev, run_id=renamed.run_id, seq=renamed.seq, type=renamed.type,
            payload_commitment=renamed.payload_commitment, manifest_id=manifest_id,
            artifact_ids=tuple(renamed.artifact_ids), agent_id=renamed.agent_id,
            created_us=renamed.create_time.ToMicroseconds())
        self.links.linked(message.run_id, message.seq, renamed.hash)
        return renamed

    def snapshot(self, message: apb.Snapshot) -> apb.Snapshot:
        manifest_id = self._renamed_manifest(message.manifest_id)
        legacy = (message.format or 1) == 1
        if not legacy and manifest_id == message.manifest_id:
            return message
        renamed = _copy(message)
        renamed.manifest_id = manifest_id
        if legacy:  # never erased in place: its state is here
            renamed.format = chain.FORMAT
            renamed.salt = self._derive("snapshot-salt", message.snapshot_id)
            renamed.state_hash = chain.state_commitment(renamed.salt, message.state_json)
        return renamed

    def erased_item(self, item: gpb.ErasedItem) -> None:
        """An erasure's event, snapshot, manifest or run item, renamed in place."""
        if item.kind in ("event", "snapshot", "run"):
            item.leaf_hash = self.links.leaf(item.leaf_hash, kept=(chain.EMPTY_RUN_LEAF,))
        elif item.kind == "manifest":
            held = item.id in self._held_manifests
            item.id = self._renamed_manifest(item.id)
            item.leaf_hash = (self._manifest_hashes.get(item.leaf_hash, item.leaf_hash) if held
                              else self._derive("hash", item.leaf_hash))
