/** Agents' iteration logs (compactor service): hot ring, warm hash chain, cold snapshots. */
import { randomUUID } from "node:crypto";
import type { ServiceConnection } from "./connection.js";
import {
  CompactorServiceService as Compactor,
  type HotIteration,
  IterationInput,
  type IterationSummary,
  type Pin,
  type ReconstructIterationResponse,
  type RecordIterationResponse,
  type VerifyRunResponse,
} from "./gen/engram/compactor/v1/compactor_service.js";
import type { CallOptions, WriteOptions } from "./options.js";
import { type Page, paginate } from "./paging.js";

export interface NewIteration {
  /** 1 for the first iteration, then last + 1; absent: the next one. */
  iteration?: number;
  planDigest?: string;
  parentDigest?: string;
  startTime?: Date;
  endTime?: Date;
  filesTouched?: number;
  netAdd?: number;
  netDel?: number;
  riskScore?: number;
  status?: string;
  /** The full detail (context snapshot, metrics, ...), sent as JSON. */
  detail?: unknown;
  /** The guardrail stage outputs, sent as JSON. */
  guardrails?: unknown;
}

export class Iterations {
  constructor(private readonly compactor: () => ServiceConnection) {}

  /**
   * Appends one iteration. The request_id (one per call unless given) makes a retry
   * return the iteration the first attempt recorded, even for "the next one".
   */
  async record(
    runId: string,
    input: NewIteration,
    options: WriteOptions = {},
  ): Promise<RecordIterationResponse> {
    const { detail, guardrails, ...fields } = input;
    const iteration = IterationInput.fromPartial({
      ...fields,
      detailJson: detail === undefined ? "" : JSON.stringify(detail),
      guardrailsJson: guardrails === undefined ? "" : JSON.stringify(guardrails),
    });
    const request = { runId, iteration, requestId: options.requestId ?? randomUUID() };
    return this.compactor().unary(Compactor.recordIteration, request, options);
  }

  /**
   * The full view of one iteration: from the hot ring, its cold snapshot, or the
   * nearest earlier snapshot plus the warm summaries since (`source` says which).
   */
  async reconstruct(
    runId: string,
    iteration: number,
    options: CallOptions = {},
  ): Promise<ReconstructIterationResponse> {
    return this.compactor().unary(Compactor.reconstructIteration, { runId, iteration }, options);
  }

  /** The hot ring: the last iterations with full detail, newest first. */
  recent(
    runId: string,
    options: CallOptions & { pageSize?: number } = {},
  ): AsyncGenerator<HotIteration, void, undefined> {
    return paginate(async (pageToken): Promise<Page<HotIteration>> => {
      const request = { runId, pageSize: options.pageSize ?? 0, pageToken };
      const response = await this.compactor().unary(
        Compactor.listRecentIterations,
        request,
        options,
      );
      return { items: response.iterations, nextPageToken: response.nextPageToken };
    });
  }

  /** Warm summaries in iteration order, from `startIteration` (default: the first). */
  summaries(
    runId: string,
    options: CallOptions & { startIteration?: number; pageSize?: number } = {},
  ): AsyncGenerator<IterationSummary, void, undefined> {
    return paginate(async (pageToken): Promise<Page<IterationSummary>> => {
      const request = {
        runId,
        startIteration: options.startIteration ?? 0,
        pageSize: options.pageSize ?? 0,
        pageToken,
      };
      const response = await this.compactor().unary(Compactor.listSummaries, request, options);
      return { items: response.summaries, nextPageToken: response.nextPageToken };
    });
  }

  /** Marks an anomaly; retention then keeps the snapshot that reconstructs it. */
  async pin(
    runId: string,
    iteration: number,
    reason: string,
    options: CallOptions = {},
  ): Promise<Pin> {
    const request = { runId, iteration, reason };
    return (await this.compactor().unary(Compactor.pinIteration, request, options)).pin!;
  }

  /** Re-hashes the warm chain, its segments and the cold snapshots; lists each problem. */
  async verify(runId: string, options: CallOptions = {}): Promise<VerifyRunResponse> {
    return this.compactor().unary(Compactor.verifyRun, { runId }, options);
  }
}
