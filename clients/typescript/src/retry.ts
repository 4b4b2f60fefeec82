/**
 * Which calls the client retries on UNAVAILABLE or CANCELLED, as a gRPC service config.
 *
 * gRPC retries a call only when nothing of the response has arrived, and inside the
 * call's one deadline. A retried request is byte for byte the first one, so a write
 * is listed here only if that request is idempotent: reads; records (content-
 * addressed ids, and a request_id the client always sets); events and iterations
 * (the client always sets request_id); runs (the client always names the run);
 * evidence (ids derived from where it points) and manifests (the same content answers
 * the manifest stored first). Not listed: StopRun (a
 * second stop is FAILED_PRECONDITION), CreateArtifact (a client stream), snapshots,
 * pins, pointers (a failed critical pointer stops the run) and admin operations.
 */
import type { RetryOptions } from "./options.js";

const IDEMPOTENT: Readonly<Record<string, readonly string[]>> = {
  "engram.shard.v1.ShardService": [
    "CreateRecord",
    "BatchCreateRecords",
    "GetRecord",
    "ListRecords",
    "SearchRecords",
    "ListDomains",
    "UpsertDomain",
    "VerifyRecords",
    "SnapshotForRun",
    "GetStatus",
    "ExportSummary",
  ],
  "engram.artifacts.v1.ArtifactsService": [
    "StartRun",
    "GetRun",
    "ListRuns",
    "GetArtifact",
    "ReadArtifact",
    "ListArtifacts",
    "VerifyArtifacts",
    "AppendEvent",
    "ListEvents",
    "ReplayEvents",
    "GetLatestSnapshot",
    "ListSnapshots",
    "Rehydrate",
    "CreateEvidence",
    "GetEvidence",
    "ListEvidence",
    "CreateManifest",
    "GetManifest",
    "ListManifests",
  ],
  "engram.compactor.v1.CompactorService": [
    "RecordIteration",
    "ListRecentIterations",
    "ListSummaries",
    "ReconstructIteration",
    "VerifyRun",
    "ListPolicyRuns",
  ],
  "engram.governance.v1.GovernanceService": [
    "GetTrust",
    "BatchGetTrust",
    "ListRules",
    "ListDecisions",
    "GetChainCheckpoint",
    "VerifyChain",
  ],
};

/** Whether the client retries this method ("/engram.shard.v1.ShardService/GetRecord"). */
export function isRetried(path: string): boolean {
  const [, service = "", method = ""] = path.split("/");
  return IDEMPOTENT[service]?.includes(method) ?? false;
}

/** The `grpc.service_config` channel option's value; undefined for a single attempt. */
export function retryServiceConfig(retry: RetryOptions | false): string | undefined {
  if (retry === false) {
    return undefined;
  }
  if (!Number.isInteger(retry.maxAttempts) || retry.maxAttempts < 1 || retry.maxAttempts > 5) {
    throw new RangeError(`retry.maxAttempts must be 1..5 (gRPC's limit), got ${retry.maxAttempts}`);
  }
  for (const name of ["initialBackoffMs", "maxBackoffMs", "backoffMultiplier"] as const) {
    if (!(retry[name] > 0)) {
      throw new RangeError(`retry.${name} must be positive, got ${retry[name]}`);
    }
  }
  if (retry.maxAttempts === 1) {
    return undefined;
  }
  const seconds = (ms: number): string => `${(ms / 1000).toFixed(3)}s`;
  return JSON.stringify({
    methodConfig: [
      {
        name: Object.entries(IDEMPOTENT).flatMap(([service, methods]) =>
          methods.map((method) => ({ service, method })),
        ),
        retryPolicy: {
          maxAttempts: retry.maxAttempts,
          initialBackoff: seconds(retry.initialBackoffMs),
          maxBackoff: seconds(retry.maxBackoffMs),
          backoffMultiplier: retry.backoffMultiplier,
          // CANCELLED: a stopping gRPC server cancels calls it received but never started
          // (grpc/grpc#41785); a call this client cancels itself is never retried.
          retryableStatusCodes: ["UNAVAILABLE", "CANCELLED"],
        },
      },
    ],
  });
}
