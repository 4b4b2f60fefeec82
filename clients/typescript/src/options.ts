/** What a client is built from: where the services are, who calls, how long to wait. */
import type { ChannelOptions } from "@grpc/grpc-js";

export type ServiceName = "shard" | "governance" | "artifacts" | "compactor";

/** `host:port` of each service; a resource whose service is missing throws on first use. */
export type Endpoints = Partial<Record<ServiceName, string>>;

/** The ports `engram up` uses when it is given no --base-port. */
export const DEFAULT_ENDPOINTS: Readonly<Record<ServiceName, string>> = Object.freeze({
  shard: "127.0.0.1:50051",
  governance: "127.0.0.1:50052",
  artifacts: "127.0.0.1:50053",
  compactor: "127.0.0.1:50054",
});

/** PEM contents (read the files yourself, or use `settingsFromEnv`). */
export interface TlsOptions {
  /** CA that signed the services' certificates; absent: the system's roots. */
  ca?: Uint8Array;
  /** Client certificate for services that require mutual TLS; needs `key`. */
  cert?: Uint8Array;
  /** The client certificate's private key; needs `cert`. */
  key?: Uint8Array;
}

/** Retries of calls that fail UNAVAILABLE, for the calls a retry cannot duplicate. */
export interface RetryOptions {
  /** Attempts in all, first included; gRPC allows at most 5. */
  maxAttempts: number;
  initialBackoffMs: number;
  maxBackoffMs: number;
  backoffMultiplier: number;
}

export const DEFAULT_RETRY: Readonly<RetryOptions> = Object.freeze({
  maxAttempts: 4,
  initialBackoffMs: 100,
  maxBackoffMs: 2000,
  backoffMultiplier: 2,
});

export interface ClientOptions {
  endpoints?: Endpoints;
  /** Bearer token sent as `authorization: Bearer <token>` on every call. */
  token?: string;
  /** Absent: plaintext. */
  tls?: TlsOptions;
  /** Deadline of a unary call; default 10 s. `Infinity`: none. */
  timeoutMs?: number;
  /** Deadline of a streaming call (uploads, downloads, snapshots); default 5 min. */
  streamTimeoutMs?: number;
  /** `false` turns retries off; a partial object overrides the defaults. */
  retry?: Partial<RetryOptions> | false;
  /** Passed to @grpc/grpc-js as they are, after the client's own. */
  channelOptions?: ChannelOptions;
}

export const DEFAULT_TIMEOUT_MS = 10_000;
export const DEFAULT_STREAM_TIMEOUT_MS = 300_000;

/** Options that every call takes. */
export interface CallOptions {
  /** This call's deadline, in ms from now; overrides the client's. `Infinity`: none. */
  timeoutMs?: number;
  /** Aborting cancels the call; it then fails with CANCELLED. */
  signal?: AbortSignal;
}

/** Options of a call that writes. */
export interface WriteOptions extends CallOptions {
  /**
   * Idempotency key. By default the client makes one per call, so its own retries
   * never write twice; pass your own to make a retry of yours safe too.
   */
  requestId?: string;
}
