/**
 * @engram/client: a typed client for Engram's gRPC services.
 *
 *     const engram = new EngramClient(settingsFromEnv());
 *     const { record } = await engram.records.add("retries need idempotency keys");
 *     const hits = await engram.records.search("idempotency");
 *
 * The generated messages and clients are exported per package (`shardv1`, ...).
 */
export { EngramClient, type RawClients } from "./client.js";
export {
  decodeStatusDetails,
  EngramError,
  type EngramErrorInit,
  findErrorInfo,
  type StatusName,
  statusName,
  toEngramError,
} from "./errors.js";
export {
  type CallOptions,
  type ClientOptions,
  DEFAULT_ENDPOINTS,
  DEFAULT_RETRY,
  DEFAULT_STREAM_TIMEOUT_MS,
  DEFAULT_TIMEOUT_MS,
  type Endpoints,
  type RetryOptions,
  type ServiceName,
  type TlsOptions,
  type WriteOptions,
} from "./options.js";
export { settingsFromEnv } from "./settings.js";
export { isRetried } from "./retry.js";
export type { Page } from "./paging.js";
export {
  type FilterConditions,
  filterMessage,
  type MemoryRecord,
  type NewRecord,
  type RecordFilter,
  Records,
  type SearchModeName,
  type SearchOptions,
} from "./records.js";
export { Runs, type StartRunOptions, type StopStatus } from "./runs.js";
export { type AppendEventOptions, Events } from "./events.js";
export {
  type ArtifactDownload,
  ArtifactStore,
  DOWNLOAD_HASH_MISMATCH,
  type DownloadOptions,
  UNEXPECTED_RESPONSE,
  type UploadOptions,
  type UploadSource,
} from "./artifacts.js";
export { Iterations, type NewIteration } from "./iterations.js";
export { status as Status } from "@grpc/grpc-js";

export * as artifactsv1 from "./gen/engram/artifacts/v1/artifacts_service.js";
export * as compactorv1 from "./gen/engram/compactor/v1/compactor_service.js";
export * as governancev1 from "./gen/engram/governance/v1/governance_service.js";
export * as shardv1 from "./gen/engram/shard/v1/shard_service.js";
