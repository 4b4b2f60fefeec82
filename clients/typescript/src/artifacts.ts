/** Run-scoped blobs (artifacts service): streaming upload and download, with hashes. */
import { createHash } from "node:crypto";
import { createReadStream, createWriteStream } from "node:fs";
import { rm } from "node:fs/promises";
import { basename } from "node:path";
import { Readable } from "node:stream";
import { pipeline } from "node:stream/promises";
import { status as Status } from "@grpc/grpc-js";
import type { ServiceConnection } from "./connection.js";
import { EngramError } from "./errors.js";
import {
  type Artifact,
  ArtifactHeader,
  ArtifactsServiceService as Artifacts,
  type CreateArtifactRequest,
  type ReadArtifactResponse,
  type VerifyArtifactsResponse,
} from "./gen/engram/artifacts/v1/artifacts_service.js";
import type { CallOptions } from "./options.js";
import { type Page, paginate } from "./paging.js";

/** Bytes to upload: a buffer, a string (UTF-8), or any (async) iterable of them, a Readable included. */
export type UploadSource =
  Uint8Array | string | Iterable<Uint8Array | string> | AsyncIterable<Uint8Array | string>;

export interface UploadOptions extends CallOptions {
  runId: string;
  stepId: string;
  /** Relative name inside the run and step ("out/report.pdf"); no "..". */
  name: string;
  /** Default: application/octet-stream. */
  mimeType?: string;
  /** A JSON object, at most 16 KiB. */
  metadata?: { [key: string]: unknown };
  /** The service refuses the upload unless the bytes have this SHA-256 (hex)... */
  expectedHash?: string;
  /** ...and this size. */
  expectedSizeBytes?: number;
  /** Bytes per message; default 1 MiB (the services accept 4 MiB messages). */
  chunkSize?: number;
}

export interface DownloadOptions extends CallOptions {
  /** Bytes per message the service sends; default 1 MiB. */
  chunkSize?: number;
}

/**
 * An artifact being read: its metadata at once, its bytes as they arrive. Iterate it
 * once, to the end (the SHA-256 and size are checked against `artifact` there), or
 * call `cancel()`.
 */
export interface ArtifactDownload extends AsyncIterable<Buffer> {
  readonly artifact: Artifact;
  cancel(): Promise<void>;
}

/** Reasons of the errors the client raises itself (domain "engram-ts"). */
export const DOWNLOAD_HASH_MISMATCH = "DOWNLOAD_HASH_MISMATCH";
export const UNEXPECTED_RESPONSE = "UNEXPECTED_RESPONSE";
const CLIENT_DOMAIN = "engram-ts";

const DEFAULT_CHUNK_BYTES = 1024 * 1024;

/** The source as Buffers of exactly `size` bytes, the last one shorter. */
async function* rechunk(
  source: UploadSource,
  size: number,
): AsyncGenerator<Buffer, void, undefined> {
  const pieces = typeof source === "string" || source instanceof Uint8Array ? [source] : source;
  let pending: Buffer[] = [];
  let pendingBytes = 0;
  for await (const piece of pieces) {
    let rest =
      typeof piece === "string"
        ? Buffer.from(piece)
        : Buffer.from(piece.buffer, piece.byteOffset, piece.byteLength);
    while (rest.length > 0) {
      const take = Math.min(size - pendingBytes, rest.length);
      pending.push(rest.subarray(0, take));
      pendingBytes += take;
      rest = rest.subarray(take);
      if (pendingBytes === size) {
        // A copy: the caller may reuse its buffers once we move on.
        yield Buffer.concat(pending);
        pending = [];
        pendingBytes = 0;
      }
    }
  }
  if (pendingBytes > 0) {
    yield Buffer.concat(pending);
  }
}

function clientError(code: Status, message: string, reason: string, method: string): EngramError {
  return new EngramError({ code, statusMessage: message, reason, domain: CLIENT_DOMAIN, method });
}

async function* verifiedChunks(
  stream: AsyncGenerator<ReadArtifactResponse, void, undefined>,
  artifact: Artifact,
): AsyncGenerator<Buffer, void, undefined> {
  const hash = createHash("sha256");
  let size = 0;
  for await (const message of stream) {
    if (message.part?.$case !== "chunk") {
      throw clientError(
        Status.INTERNAL,
        `artifact ${artifact.artifactId}: a ${message.part?.$case ?? "empty"} message among the bytes`,
        UNEXPECTED_RESPONSE,
        Artifacts.readArtifact.path,
      );
    }
    hash.update(message.part.value);
    size += message.part.value.length;
    yield message.part.value;
  }
  const digest = hash.digest("hex");
  if (digest !== artifact.hash || size !== artifact.sizeBytes) {
    throw clientError(
      Status.DATA_LOSS,
      `artifact ${artifact.artifactId}: received ${size} bytes with SHA-256 ${digest}, ` +
        `expected ${artifact.sizeBytes} bytes with ${artifact.hash}`,
      DOWNLOAD_HASH_MISMATCH,
      Artifacts.readArtifact.path,
    );
  }
}

export class ArtifactStore {
  constructor(private readonly artifacts: () => ServiceConnection) {}

  /**
   * Streams `source` as one artifact: header, chunks, then a trailer with the size and
   * SHA-256 of what was sent, so the service stores nothing unless every byte arrived.
   * Not retried (a stream cannot be replayed); ALREADY_EXISTS if the path is taken.
   */
  async upload(source: UploadSource, options: UploadOptions): Promise<Artifact> {
    const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_BYTES;
    if (!Number.isInteger(chunkSize) || chunkSize <= 0) {
      throw new RangeError(`chunkSize must be a positive integer, got ${chunkSize}`);
    }
    const header = ArtifactHeader.fromPartial({
      runId: options.runId,
      stepId: options.stepId,
      name: options.name,
      mimeType: options.mimeType ?? "",
      metadataJson: options.metadata === undefined ? "" : JSON.stringify(options.metadata),
      expectedSizeBytes: options.expectedSizeBytes,
      expectedHash: options.expectedHash ?? "",
    });
    const produce = async (
      send: (message: CreateArtifactRequest) => Promise<void>,
    ): Promise<void> => {
      await send({ part: { $case: "header", value: header } });
      const hash = createHash("sha256");
      let size = 0;
      for await (const chunk of rechunk(source, chunkSize)) {
        hash.update(chunk);
        size += chunk.length;
        await send({ part: { $case: "chunk", value: chunk } });
      }
      await send({
        part: { $case: "trailer", value: { sizeBytes: size, sha256: hash.digest("hex") } },
      });
    };
    return this.artifacts()
      .clientStream(Artifacts.createArtifact, produce, options)
      .then((response) => response.artifact!);
  }

  /** `upload` of a file, read as it is sent; `name` defaults to the file's name. */
  async uploadFile(
    path: string,
    options: Omit<UploadOptions, "name"> & { name?: string },
  ): Promise<Artifact> {
    const chunkSize = options.chunkSize ?? DEFAULT_CHUNK_BYTES;
    const file = createReadStream(path, { highWaterMark: chunkSize });
    return this.upload(file, { ...options, name: options.name ?? basename(path) }).finally(() =>
      file.destroy(),
    );
  }

  /**
   * Starts reading an artifact and resolves once its metadata has arrived. A missing
   * or altered blob fails with DATA_LOSS (BLOB_MISSING, BLOB_HASH_MISMATCH) from the
   * service; the client checks the hash again (DOWNLOAD_HASH_MISMATCH).
   */
  async download(artifactId: string, options: DownloadOptions = {}): Promise<ArtifactDownload> {
    const request = { artifactId, chunkSize: options.chunkSize ?? 0 };
    const stream = this.artifacts().serverStream(Artifacts.readArtifact, request, options);
    const first = await stream.next();
    if (first.done === true || first.value.part?.$case !== "artifact") {
      await stream.return();
      throw clientError(
        Status.INTERNAL,
        `artifact ${artifactId}: the stream did not start with the artifact's metadata`,
        UNEXPECTED_RESPONSE,
        Artifacts.readArtifact.path,
      );
    }
    const artifact = first.value.part.value;
    const chunks = verifiedChunks(stream, artifact);
    return {
      artifact,
      [Symbol.asyncIterator]: () => chunks,
      cancel: async () => {
        await chunks.return();
        await stream.return();
      },
    };
  }

  /** The whole artifact in memory. */
  async readAll(
    artifactId: string,
    options: DownloadOptions = {},
  ): Promise<{ artifact: Artifact; data: Buffer }> {
    const download = await this.download(artifactId, options);
    const parts: Buffer[] = [];
    for await (const chunk of download) {
      parts.push(chunk);
    }
    return { artifact: download.artifact, data: Buffer.concat(parts) };
  }

  /** Writes the artifact to `path`; on any failure the partial file is removed. */
  async downloadToFile(
    artifactId: string,
    path: string,
    options: DownloadOptions = {},
  ): Promise<Artifact> {
    const download = await this.download(artifactId, options);
    try {
      await pipeline(Readable.from(download), createWriteStream(path));
    } catch (error) {
      await download.cancel();
      await rm(path, { force: true });
      throw error;
    }
    return download.artifact;
  }

  async get(artifactId: string, options: CallOptions = {}): Promise<Artifact> {
    return (await this.artifacts().unary(Artifacts.getArtifact, { artifactId }, options)).artifact!;
  }

  /** A run's artifacts (or one step's), oldest first. */
  list(
    runId: string,
    options: CallOptions & { stepId?: string; pageSize?: number } = {},
  ): AsyncGenerator<Artifact, void, undefined> {
    return paginate(async (pageToken): Promise<Page<Artifact>> => {
      const request = {
        runId,
        stepId: options.stepId ?? "",
        pageSize: options.pageSize ?? 0,
        pageToken,
      };
      const response = await this.artifacts().unary(Artifacts.listArtifacts, request, options);
      return { items: response.artifacts, nextPageToken: response.nextPageToken };
    });
  }

  /** Re-hashes the blobs of one run (default: every run of the fleet); lists each problem. */
  async verify(runId = "", options: CallOptions = {}): Promise<VerifyArtifactsResponse> {
    return this.artifacts().unary(Artifacts.verifyArtifacts, { runId }, options);
  }
}
