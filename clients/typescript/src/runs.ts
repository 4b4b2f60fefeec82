/** Runs (artifacts service): the scope of events, artifacts and snapshots. */
import { randomUUID } from "node:crypto";
import type { ServiceConnection } from "./connection.js";
import {
  ArtifactsServiceService as Artifacts,
  type RehydrateResponse,
  type Run,
  RunStatus,
  type StartRunResponse,
} from "./gen/engram/artifacts/v1/artifacts_service.js";
import type { CallOptions } from "./options.js";
import { type Page, paginate } from "./paging.js";

export interface StartRunOptions extends CallOptions {
  /** Absent: the client names the run (`run_<32 hex>`, as the service would). */
  runId?: string;
  /** A JSON object, stored with the run. */
  metadata?: { [key: string]: unknown };
}

/** How a caller may stop a run (SYSTEM_ERROR is the service's own). */
export type StopStatus = "succeeded" | "failed" | "cancelled";

const STOP_STATUSES: Readonly<Record<StopStatus, RunStatus>> = {
  succeeded: RunStatus.RUN_STATUS_SUCCEEDED,
  failed: RunStatus.RUN_STATUS_FAILED,
  cancelled: RunStatus.RUN_STATUS_CANCELLED,
};

export class Runs {
  constructor(private readonly artifacts: () => ServiceConnection) {}

  /**
   * Starts a run; a run id that already names a running run of the fleet returns it
   * with `created: false`. The id is always sent, so a retried start finds its run.
   */
  async start(options: StartRunOptions = {}): Promise<StartRunResponse> {
    const request = {
      runId: options.runId ?? `run_${randomUUID().replaceAll("-", "")}`,
      metadataJson: options.metadata === undefined ? "" : JSON.stringify(options.metadata),
    };
    return this.artifacts().unary(Artifacts.startRun, request, options);
  }

  /** Appends a "run.stopped" event. Not retried: a second stop is FAILED_PRECONDITION. */
  async stop(
    runId: string,
    status: StopStatus,
    reason = "",
    options: CallOptions = {},
  ): Promise<Run> {
    const request = { runId, status: STOP_STATUSES[status], reason };
    return (await this.artifacts().unary(Artifacts.stopRun, request, options)).run!;
  }

  async get(runId: string, options: CallOptions = {}): Promise<Run> {
    return (await this.artifacts().unary(Artifacts.getRun, { runId }, options)).run!;
  }

  /** The fleet's runs, newest first. */
  list(options: CallOptions & { pageSize?: number } = {}): AsyncGenerator<Run, void, undefined> {
    return paginate(async (pageToken): Promise<Page<Run>> => {
      const request = { pageSize: options.pageSize ?? 0, pageToken };
      const response = await this.artifacts().unary(Artifacts.listRuns, request, options);
      return { items: response.runs, nextPageToken: response.nextPageToken };
    });
  }

  /** The latest snapshot and the events after it (at most `maxEvents`, default 10000). */
  async rehydrate(
    runId: string,
    options: CallOptions & { maxEvents?: number } = {},
  ): Promise<RehydrateResponse> {
    const request = { runId, maxEvents: options.maxEvents ?? 0 };
    return this.artifacts().unary(Artifacts.rehydrate, request, options);
  }
}
