/** A run's append-only, hash-chained event log (artifacts service). */
import { randomUUID } from "node:crypto";
import type { ServiceConnection } from "./connection.js";
import {
  type AppendEventResponse,
  ArtifactsServiceService as Artifacts,
  type Event,
} from "./gen/engram/artifacts/v1/artifacts_service.js";
import type { CallOptions, WriteOptions } from "./options.js";
import { type Page, paginate } from "./paging.js";

export interface AppendEventOptions extends WriteOptions {
  manifestId?: string;
  artifactIds?: string[];
}

export class Events {
  constructor(private readonly artifacts: () => ServiceConnection) {}

  /**
   * Appends one event to a running run; `payload` is sent as JSON (at most 60 KiB).
   * The service assigns seq and hash; a retry returns the first event, `created: false`.
   */
  async append(
    runId: string,
    type: string,
    payload: unknown = {},
    options: AppendEventOptions = {},
  ): Promise<AppendEventResponse> {
    const request = {
      runId,
      type,
      payloadJson: JSON.stringify(payload),
      manifestId: options.manifestId ?? "",
      artifactIds: options.artifactIds ?? [],
      requestId: options.requestId ?? randomUUID(),
    };
    return this.artifacts().unary(Artifacts.appendEvent, request, options);
  }

  /** Events with seq > `afterSeq` (default 0), in order; pages fetched as the loop goes. */
  list(
    runId: string,
    options: CallOptions & { afterSeq?: number; pageSize?: number } = {},
  ): AsyncGenerator<Event, void, undefined> {
    return paginate(async (pageToken): Promise<Page<Event>> => {
      const request = {
        runId,
        afterSeq: options.afterSeq ?? 0,
        pageSize: options.pageSize ?? 0,
        pageToken,
      };
      const response = await this.artifacts().unary(Artifacts.listEvents, request, options);
      return { items: response.events, nextPageToken: response.nextPageToken };
    });
  }

  /** Every event from seq 1, the chain re-checked by the service (DATA_LOSS on a broken link). */
  async *replay(runId: string, options: CallOptions = {}): AsyncGenerator<Event, void, undefined> {
    for await (const message of this.artifacts().serverStream(
      Artifacts.replayEvents,
      { runId },
      options,
    )) {
      yield message.event!;
    }
  }
}
