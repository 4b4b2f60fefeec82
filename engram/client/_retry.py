"""Which calls the SDK's channels retry, as a gRPC service config.

gRPC retries a call only while nothing of its response has arrived and within its one
deadline, resending the same bytes. A method is listed in :data:`RETRIED` only when sending
it again cannot do the work twice nor turn a success into an error: reads; writes that carry
an idempotency key the SDK always sets (records, events, snapshots, iterations, rules) or
that are keyed by their content (runs by name, evidence and manifests by content, an artifact
by its run, step, name and bytes, imported records, runs, run items, erasures and tombstones
by their ids and hashes, an erasure by its request id, carrying one out by its erasure id).
:data:`NOT_RETRIED` names every other method and why;
``tests/unit/client/test_retry_policy.py`` fails when an RPC is in neither, so a new RPC gets
this decision made. The TypeScript client's list (clients/typescript/src/retry.ts) is the
same minus the writes it does not key yet.
"""

from __future__ import annotations

import json

RETRIED: dict[str, tuple[str, ...]] = {
    "engram.shard.v1.ShardService": (
        "CreateRecord", "BatchCreateRecords", "ImportRecords", "GetRecord", "ListRecords",
        "SearchRecords", "ListDomains", "UpsertDomain", "VerifyRecords", "SnapshotForRun",
        "GetStatus", "ExportSummary", "ForgetRecords", "ListTombstones", "ImportTombstones"),
    "engram.artifacts.v1.ArtifactsService": (
        "StartRun", "GetRun", "ListRuns", "CreateArtifact", "GetArtifact", "ReadArtifact",
        "ListArtifacts", "VerifyArtifacts", "AppendEvent", "ListEvents", "ReplayEvents",
        "CreateSnapshot", "GetLatestSnapshot", "ListSnapshots", "Rehydrate", "CreateEvidence",
        "GetEvidence", "ListEvidence", "CreateManifest", "GetManifest", "ListManifests",
        "ForgetRuns", "FindRuns", "ImportRun", "ImportArtifact", "ImportRunItems"),
    "engram.compactor.v1.CompactorService": (
        "RecordIteration", "ListRecentIterations", "ListSummaries", "ReconstructIteration",
        "VerifyRun", "ListPolicyRuns", "ForgetIterations", "FindIterationLogs",
        "ImportIterations"),
    "engram.governance.v1.GovernanceService": (
        "GetTrust", "BatchGetTrust", "CreateRule", "ListRules", "ListDecisions",
        "GetChainCheckpoint", "VerifyChain", "BatchGetDecisions", "RevokeToken",
        "RevokeAgentTokens", "ListAccessRestrictions", "RecordErasure", "GetErasure",
        "ImportDecisions", "ListErasures", "ImportErasures"),
    # Pure: the same texts give the same vectors (the shard's own channel retries itself).
    "engram.embedder.v1.EmbedderService": ("Embed", "Describe"),
}

NOT_RETRIED: dict[str, str] = {
    "engram.artifacts.v1.ArtifactsService/StopRun":
        "a second stop of a stopped run is FAILED_PRECONDITION",
    "engram.artifacts.v1.ArtifactsService/ResolvePointer":
        "an unresolved critical pointer stops the run; the caller decides to ask again",
    "engram.compactor.v1.CompactorService/PinIteration":
        "a second pin answers the first, its reason kept: the operator pins, and sees it",
    "engram.compactor.v1.CompactorService/CompactMemory": "an operator's policy run",
    "engram.compactor.v1.CompactorService/ApplyMemoryRetention": "an operator's policy run",
    "engram.shard.v1.ShardService/CompactRecords": "an operator's policy run",
    "engram.shard.v1.ShardService/ApplyRetention": "an operator's policy run",
    "engram.governance.v1.GovernanceService/SetTier":
        "each change is a witness-chain entry; the operator sees the outcome",
    "engram.governance.v1.GovernanceService/DeleteRule":
        "a second delete of a deleted rule is NOT_FOUND",
    "engram.governance.v1.GovernanceService/DecideWrites":
        "the shard's own channel (retries off); its caller retries the whole write",
    "engram.governance.v1.GovernanceService/DecideWriteBatches":
        "the shard's own channel (retries off); each write's caller retries it",
}

RETRY_POLICY = {
    "maxAttempts": 5,
    "initialBackoff": "0.05s",
    "maxBackoff": "1s",
    "backoffMultiplier": 2,
    "retryableStatusCodes": ["UNAVAILABLE", "CANCELLED"],
}
"""Up to 4 more attempts, 50 ms then doubling up to 1 s (jittered by gRPC), within the
call's deadline, for a call that ends UNAVAILABLE (the service was not reached, or a hop lost
the call or its reply) or CANCELLED: a gRPC server that stops cancels the calls it had
received but not yet handed to a handler (grpc/grpc#41785; about 1 in 100 calls racing a stop
here), which never started. A call the caller cancels is not retried (that status is the
client's own, not an answer)."""

SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": service, "method": method}
             for service, methods in RETRIED.items() for method in methods],
    "retryPolicy": RETRY_POLICY,
}]})
