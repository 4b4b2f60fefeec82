/**
 * A failed call, as the caller sees it.
 *
 *     Error
 *     └── EngramError   gRPC status (code and name), the server's message, and the
 *                       google.rpc.ErrorInfo {reason, domain, metadata} decoded from
 *                       the `grpc-status-details-bin` trailer
 *
 * Engram's services put exactly one ErrorInfo (domain "engram.dev") in every error
 * they raise; errors made by gRPC itself (deadline, connection refused) have none,
 * so their `reason` is "".
 */
import { Metadata, status as Status } from "@grpc/grpc-js";
import type { Any } from "./gen/google/protobuf/any.js";
import { ErrorInfo } from "./gen/google/rpc/error_details.js";
import { Status as RpcStatus } from "./gen/google/rpc/status.js";

/** The name of a gRPC status code: "INVALID_ARGUMENT", "UNAUTHENTICATED", ... */
export type StatusName = Exclude<keyof typeof Status, number>;

const STATUS_DETAILS_KEY = "grpc-status-details-bin";
const ERROR_INFO_TYPE = "type.googleapis.com/google.rpc.ErrorInfo";

export interface EngramErrorInit {
  code: Status;
  statusMessage: string;
  reason?: string;
  domain?: string;
  metadata?: Record<string, string>;
  details?: Any[];
  method?: string;
  cause?: unknown;
}

export class EngramError extends Error {
  /** Numeric gRPC status code (`status.INVALID_ARGUMENT` from @grpc/grpc-js is 3). */
  readonly code: Status;
  /** The code's name, e.g. "INVALID_ARGUMENT". */
  readonly codeName: StatusName;
  /** The server's message as sent, without the code or reason around it. */
  readonly statusMessage: string;
  /** google.rpc.ErrorInfo.reason, e.g. "IMPORTANCE_OUT_OF_RANGE"; "" when there is none. */
  readonly reason: string;
  /** google.rpc.ErrorInfo.domain ("engram.dev" for the services' own errors). */
  readonly domain: string;
  /** google.rpc.ErrorInfo.metadata. */
  readonly metadata: Readonly<Record<string, string>>;
  /** Every detail of the google.rpc.Status, ErrorInfo included, still packed. */
  readonly details: readonly Any[];
  /** The full gRPC method ("/engram.shard.v1.ShardService/CreateRecord") when known. */
  readonly method: string;

  constructor(init: EngramErrorInit) {
    const codeName = statusName(init.code);
    const reason = init.reason ?? "";
    super(`${codeName}: ${init.statusMessage}${reason ? ` [${reason}]` : ""}`, {
      cause: init.cause,
    });
    this.name = "EngramError";
    this.code = init.code;
    this.codeName = codeName;
    this.statusMessage = init.statusMessage;
    this.reason = reason;
    this.domain = init.domain ?? "";
    this.metadata = Object.freeze({ ...(init.metadata ?? {}) });
    this.details = Object.freeze([...(init.details ?? [])]);
    this.method = init.method ?? "";
  }
}

export function statusName(code: Status): StatusName {
  return (Status[code] as StatusName | undefined) ?? "UNKNOWN";
}

interface GrpcErrorShape {
  code: number;
  details?: string;
  metadata?: Metadata;
}

function isGrpcError(error: unknown): error is Error & GrpcErrorShape {
  return error instanceof Error && typeof (error as Partial<GrpcErrorShape>).code === "number";
}

/**
 * Turns whatever a call threw into an EngramError. A gRPC error keeps its code and
 * gains the ErrorInfo of its trailer; anything else (a bug, a failed source stream)
 * is returned unchanged, so it is never disguised as a server answer.
 */
export function toEngramError(error: unknown, method = ""): unknown {
  if (error instanceof EngramError || !isGrpcError(error)) {
    return error;
  }
  const init: EngramErrorInit = {
    code: error.code as Status,
    statusMessage: error.details ?? error.message,
    method,
    cause: error,
  };
  const status = decodeStatusDetails(error.metadata);
  if (status !== undefined) {
    init.details = status.details;
    const info = findErrorInfo(status.details);
    if (info !== undefined) {
      init.reason = info.reason;
      init.domain = info.domain;
      init.metadata = info.metadata;
    }
  }
  return new EngramError(init);
}

/** The google.rpc.Status of a trailer; undefined when absent or not decodable. */
export function decodeStatusDetails(metadata: Metadata | undefined): RpcStatus | undefined {
  const value = metadata?.get(STATUS_DETAILS_KEY)[0];
  if (value === undefined || typeof value === "string") {
    return undefined;
  }
  try {
    return RpcStatus.decode(value);
  } catch {
    // A malformed trailer must not hide the status code the call did carry.
    return undefined;
  }
}

export function findErrorInfo(details: readonly Any[]): ErrorInfo | undefined {
  const packed = details.find((detail) => detail.typeUrl === ERROR_INFO_TYPE);
  if (packed === undefined) {
    return undefined;
  }
  try {
    return ErrorInfo.decode(packed.value);
  } catch {
    return undefined;
  }
}
