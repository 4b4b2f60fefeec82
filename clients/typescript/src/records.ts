/** Memory records (shard service): write, read, list, search, verify. */
import { randomUUID } from "node:crypto";
import type { ServiceConnection } from "./connection.js";
import {
  BatchCreateRecordsRequest,
  CreateRecordRequest,
  type CreateRecordResponse,
  type GetStatusResponse,
  ListRecordsRequest,
  type Record as MemoryRecord,
  RecordFilter as RecordFilterMessage,
  RecordInput,
  SearchMode,
  type SearchHit,
  SearchRecordsRequest,
  ShardServiceService as Shard,
  VerifyRecordsRequest,
  type VerifyRecordsResponse,
} from "./gen/engram/shard/v1/shard_service.js";
import type { CallOptions, WriteOptions } from "./options.js";
import { type Page, paginate } from "./paging.js";

export type { MemoryRecord };

export interface NewRecord {
  content: string;
  runId?: string;
  /** Absent: routed by keyword score. */
  domain?: string;
  source?: string;
  /** 0..1; absent means 0.5. */
  importance?: number;
  tags?: string[];
  metadata?: { [key: string]: string };
}

/** Conditions a record must all meet (search applies them before ranking). */
export interface FilterConditions {
  /** Records carrying at least one of these tags. */
  tagsAny?: string[];
  /** Metadata key = value pairs; a record must carry every one. */
  metadata?: { [key: string]: string };
  /** Created strictly after: a Date or an RFC 3339 string ("2026-05-01T12:00:00Z"). */
  createdAfter?: Date | string;
  /** Created strictly before: a Date or an RFC 3339 string. */
  createdBefore?: Date | string;
  /** 0..1. */
  minImportance?: number;
}

export interface RecordFilter extends FilterConditions {
  /** Absent: every run; "" for legacy records only. */
  runId?: string;
  /** Records must carry all of these tags. */
  tags?: string[];
  domain?: string;
  agentId?: string;
  pageSize?: number;
}

const RFC3339 = /^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$/;

function instant(value: Date | string | undefined, name: string): Date | undefined {
  if (value === undefined) return undefined;
  const date = typeof value === "string" && RFC3339.test(value) ? new Date(value) : value;
  if (!(date instanceof Date) || Number.isNaN(date.getTime())) {
    throw new RangeError(
      `${name}: ${String(value)} is not an RFC 3339 time (e.g. 2026-05-01T12:00:00Z)`,
    );
  }
  return date;
}

/** The conditions as the RecordFilter message; bad input throws before anything is sent. */
export function filterMessage(
  conditions: FilterConditions & { author?: string },
): RecordFilterMessage {
  const { tagsAny, metadata, createdAfter, createdBefore, minImportance, author } = conditions;
  if (minImportance !== undefined && !(minImportance >= 0 && minImportance <= 1)) {
    throw new RangeError(`minImportance must be 0..1, got ${minImportance}`);
  }
  return RecordFilterMessage.fromPartial({
    tagsAny,
    metadata,
    agentId: author,
    createdAfter: instant(createdAfter, "createdAfter"),
    createdBefore: instant(createdBefore, "createdBefore"),
    minImportance,
  });
}

export type SearchModeName = "lexical" | "semantic" | "hybrid";

export interface SearchOptions extends CallOptions {
  /** 1..100; default 10. */
  limit?: number;
  runId?: string;
  domain?: string;
  /** Follow cross-reference links from the hits. */
  cross?: boolean;
  /** Default: the service's (hybrid). */
  mode?: SearchModeName;
  /** Records must carry all of these tags. */
  tags?: string[];
  /** Tags any, metadata, created window, minimum importance: the best `limit` among matches. */
  filter?: FilterConditions & { author?: string };
}

const SEARCH_MODES: Readonly<Record<SearchModeName, SearchMode>> = {
  lexical: SearchMode.SEARCH_MODE_LEXICAL,
  semantic: SearchMode.SEARCH_MODE_SEMANTIC,
  hybrid: SearchMode.SEARCH_MODE_HYBRID,
};

export class Records {
  constructor(private readonly shard: () => ServiceConnection) {}

  /**
   * Stores one record. A retry, or the same content again in the same run, returns
   * the stored record with `created: false`.
   */
  async create(record: NewRecord, options: WriteOptions = {}): Promise<CreateRecordResponse> {
    const request = CreateRecordRequest.fromPartial({
      record: RecordInput.fromPartial(record),
      requestId: options.requestId ?? randomUUID(),
    });
    return this.shard().unary(Shard.createRecord, request, options);
  }

  /** `create` with only the content and, optionally, the other fields. */
  async add(
    content: string,
    fields: Omit<NewRecord, "content"> = {},
    options: WriteOptions = {},
  ): Promise<CreateRecordResponse> {
    return this.create({ ...fields, content }, options);
  }

  /** Up to 1000 records in one transaction: all are stored or none. */
  async createMany(
    records: NewRecord[],
    options: WriteOptions = {},
  ): Promise<CreateRecordResponse[]> {
    const request = BatchCreateRecordsRequest.fromPartial({
      records: records.map((record) => RecordInput.fromPartial(record)),
      requestId: options.requestId ?? randomUUID(),
    });
    return (await this.shard().unary(Shard.batchCreateRecords, request, options)).results;
  }

  /** NOT_FOUND (an EngramError) when there is no such record in the caller's fleet. */
  async get(id: string, options: CallOptions = {}): Promise<MemoryRecord> {
    const response = await this.shard().unary(Shard.getRecord, { id }, options);
    return response.record!;
  }

  /** Newest first; pages are fetched as the loop goes. */
  list(
    filter: RecordFilter = {},
    options: CallOptions = {},
  ): AsyncGenerator<MemoryRecord, void, undefined> {
    return paginate((pageToken) => this.listPage({ ...filter, pageToken }, options));
  }

  /** One page, for callers that keep the token themselves. */
  async listPage(
    filter: RecordFilter & { pageToken?: string },
    options: CallOptions = {},
  ): Promise<Page<MemoryRecord>> {
    const { tagsAny, metadata, createdAfter, createdBefore, minImportance, ...fields } = filter;
    const conditions = { tagsAny, metadata, createdAfter, createdBefore, minImportance };
    const response = await this.shard().unary(
      Shard.listRecords,
      ListRecordsRequest.fromPartial({ ...fields, filter: filterMessage(conditions) }),
      options,
    );
    return { items: response.records, nextPageToken: response.nextPageToken };
  }

  /** Hits, best first, scored by relevance x importance x recency x trust. */
  async search(query: string, options: SearchOptions = {}): Promise<SearchHit[]> {
    const { limit, runId, domain, cross, mode, tags, filter } = options;
    const request = SearchRecordsRequest.fromPartial({
      query,
      limit,
      runId,
      domain,
      cross,
      tags,
      filter: filterMessage(filter ?? {}),
      mode: mode === undefined ? SearchMode.SEARCH_MODE_UNSPECIFIED : SEARCH_MODES[mode],
    });
    return (await this.shard().unary(Shard.searchRecords, request, options)).hits;
  }

  /**
   * Re-hashes the records (`"all"`: every record and tombstone of the fleet, a page of
   * `pageSize` a call, summed into one answer); lists each mismatch, and each tombstone no
   * erasure recorded by governance lists (`reason` TOMBSTONE_NOT_IN_ERASURE).
   * `tombstonesUnconfirmed`: tombstones governance could not be asked about.
   */
  async verify(
    ids: string[] | "all",
    options: CallOptions & { pageSize?: number } = {},
  ): Promise<VerifyRecordsResponse> {
    if (ids !== "all") {
      const request = VerifyRecordsRequest.fromPartial({ ids });
      return this.shard().unary(Shard.verifyRecords, request, options);
    }
    const { pageSize = 1000, ...callOptions } = options;
    const total: VerifyRecordsResponse = {
      checked: 0,
      failures: [],
      tombstoned: 0,
      nextPageToken: "",
      tombstonesUnconfirmed: 0,
    };
    let pageToken = "";
    do {
      const page = await this.shard().unary(
        Shard.verifyRecords,
        VerifyRecordsRequest.fromPartial({ all: true, pageSize, pageToken }),
        callOptions,
      );
      total.checked += page.checked;
      total.tombstoned += page.tombstoned;
      total.tombstonesUnconfirmed += page.tombstonesUnconfirmed;
      total.failures.push(...page.failures);
      pageToken = page.nextPageToken;
    } while (pageToken);
    return total;
  }

  /** Exactly one run's records, oldest first, each re-hashed by the service unless `verify: false`. */
  async *snapshot(
    runId: string,
    options: CallOptions & { verify?: boolean } = {},
  ): AsyncGenerator<MemoryRecord, void, undefined> {
    const request = { runId, verify: options.verify };
    for await (const message of this.shard().serverStream(Shard.snapshotForRun, request, options)) {
      yield message.record!;
    }
  }

  /** The caller's fleet: record and link counts, domains, indexing lag. */
  async status(options: CallOptions = {}): Promise<GetStatusResponse> {
    return this.shard().unary(Shard.getStatus, {}, options);
  }
}
