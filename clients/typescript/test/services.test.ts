/**
 * The client against the real services: one `engram up` for the whole file (started
 * in `before`, stopped in `after`), an agent token of a fleet of its own.
 */
import assert from "node:assert/strict";
import { createHash, randomBytes } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import {
  artifactsv1,
  compactorv1,
  EngramClient,
  EngramError,
  type MemoryRecord,
} from "../src/index.js";
import { type Stack, startStack } from "./support/stack.js";

const AGENT = "ts-agent";
const FLEET = "ts-fleet";

let stack: Stack;
let engram: EngramClient;
let scratch: string;

before(async () => {
  stack = await startStack();
  engram = new EngramClient({
    endpoints: stack.endpoints,
    token: await stack.agentToken(AGENT, FLEET),
  });
  scratch = mkdtempSync(join(tmpdir(), "engram-ts-files-"));
});

after(async () => {
  engram?.close();
  await stack?.stop();
  if (scratch) {
    rmSync(scratch, { recursive: true, force: true });
  }
});

async function rejection(promise: Promise<unknown>): Promise<EngramError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof EngramError, `expected an EngramError, got ${String(error)}`);
    return error;
  }
  assert.fail("the call succeeded");
}

async function collect<T>(items: AsyncIterable<T>): Promise<T[]> {
  const all: T[] = [];
  for await (const item of items) {
    all.push(item);
  }
  return all;
}

const sha256 = (data: Uint8Array): string => createHash("sha256").update(data).digest("hex");

describe("records", () => {
  test("create, get and search; the author and fleet come from the token", async () => {
    const written = await engram.records.add("Lesson learned: retries need idempotency keys", {
      importance: 0.8,
      tags: ["ops"],
      runId: "run-records",
    });
    assert.equal(written.created, true);
    const record = written.record!;
    assert.equal(record.agentId, AGENT);
    assert.equal(record.fleetId, FLEET);
    assert.equal(
      record.contentHash,
      sha256(Buffer.from("Lesson learned: retries need idempotency keys")),
    );
    assert.ok(record.createTime instanceof Date);

    const fetched = await engram.records.get(record.id);
    assert.deepEqual(fetched, record);

    const hits = await engram.records.search("idempotency keys", { limit: 5 });
    assert.ok(hits.length >= 1);
    assert.equal(hits[0]!.record!.id, record.id);
    assert.ok(hits[0]!.score > 0);

    const again = await engram.records.add("Lesson learned: retries need idempotency keys", {
      importance: 0.8,
      tags: ["ops"],
      runId: "run-records",
    });
    assert.equal(again.created, false, "the same record again is not stored twice");
    assert.equal(again.record!.id, record.id);

    const check = await engram.records.verify([record.id]);
    assert.equal(check.checked, 1);
    assert.deepEqual(check.failures, []);

    // every record of the fleet, a page of one a call (an agent may not ask for all at once)
    const whole = await engram.records.verify("all", { pageSize: 1 });
    assert.ok(whole.checked >= 1);
    assert.deepEqual(whole.failures, []);
    assert.equal(whole.nextPageToken, "");
  });

  test("list pages through a run's records, newest first", async () => {
    const runId = "run-paging";
    const written = await engram.records.createMany(
      ["first page note", "second page note", "third page note"].map((content) => ({
        content,
        runId,
      })),
    );
    assert.equal(written.length, 3);
    const firstPage = await engram.records.listPage({ runId, pageSize: 2 });
    assert.equal(firstPage.items.length, 2);
    assert.notEqual(firstPage.nextPageToken, "");

    const listed: MemoryRecord[] = await collect(engram.records.list({ runId, pageSize: 2 }));
    assert.deepEqual(
      new Set(listed.map((record) => record.id)),
      new Set(written.map((result) => result.record!.id)),
    );
    const snapshot = await collect(engram.records.snapshot(runId));
    assert.equal(snapshot.length, 3);
  });

  test("search and list filters: tags any, metadata, author, created window, importance", async () => {
    const strong = await engram.records.createMany(
      Array.from({ length: 12 }, (_, i) => ({
        content: `filtered rollout checklist rollout checklist ${i}`,
        importance: 0.9,
      })),
    );
    const weak = await engram.records.createMany(
      [0, 1].map((i) => ({
        content: `a long aside on lunch and travel, then the rollout checklist once ${i}`,
        tags: ["rare-ts"],
        metadata: { team: "blue" },
        importance: 0.3,
      })),
    );
    const weakIds = new Set(weak.map((result) => result.record!.id));
    const top = await engram.records.search("rollout checklist", { limit: 2, mode: "lexical" });
    assert.ok(top.every((hit) => !weakIds.has(hit.record!.id)));
    // Filters apply before ranking: the low-ranked matches are the top 2 among matching.
    const filtered = await engram.records.search("rollout checklist", {
      limit: 2,
      mode: "lexical",
      filter: {
        tagsAny: ["rare-ts"],
        metadata: { team: "blue" },
        author: AGENT,
        minImportance: 0.2,
      },
    });
    assert.deepEqual(new Set(filtered.map((hit) => hit.record!.id)), weakIds);
    const first = strong[0]!.record!.createTime!;
    const listed = await collect(
      engram.records.list({ tagsAny: ["rare-ts"], createdAfter: first.toISOString(), pageSize: 1 }),
    );
    assert.deepEqual(new Set(listed.map((record) => record.id)), weakIds);
    const none = await collect(engram.records.list({ tagsAny: ["rare-ts"], createdBefore: first }));
    assert.equal(none.length, 0);
    await assert.rejects(
      engram.records.search("x", { filter: { createdAfter: "yesterday" } }),
      RangeError,
    );
    const error = await rejection(
      engram.records.search("x", { filter: { metadata: { 'a"b': "v" } } }),
    );
    assert.equal(error.codeName, "INVALID_ARGUMENT");
    assert.equal(error.reason, "INVALID_METADATA_KEY");
  });

  test("a write without a token is UNAUTHENTICATED", async () => {
    const anonymous = new EngramClient({ endpoints: stack.endpoints });
    try {
      const error = await rejection(anonymous.records.add("who wrote this?"));
      assert.equal(error.codeName, "UNAUTHENTICATED");
      assert.equal(error.reason, "TOKEN_MISSING");
      assert.equal(error.domain, "engram.dev");
    } finally {
      anonymous.close();
    }
  });

  test("importance 3.0 is INVALID_ARGUMENT with reason IMPORTANCE_OUT_OF_RANGE", async () => {
    const error = await rejection(engram.records.add("too important", { importance: 3.0 }));
    assert.equal(error.codeName, "INVALID_ARGUMENT");
    assert.equal(error.reason, "IMPORTANCE_OUT_OF_RANGE");
    assert.match(error.statusMessage, /importance/);
    assert.match(error.message, /^INVALID_ARGUMENT: .*\[IMPORTANCE_OUT_OF_RANGE\]$/);
  });

  test("an unknown id is NOT_FOUND with the id in the error's metadata", async () => {
    const error = await rejection(engram.records.get("0".repeat(64)));
    assert.equal(error.codeName, "NOT_FOUND");
    assert.equal(error.reason, "RECORD_NOT_FOUND");
    assert.equal(error.metadata.record_id, "0".repeat(64));
  });
});

describe("runs and events", () => {
  test("start, append, list, replay and stop", async () => {
    const { run, created } = await engram.runs.start({ metadata: { purpose: "ts test" } });
    assert.equal(created, true);
    assert.match(run!.runId, /^run_[0-9a-f]{32}$/);
    assert.equal(run!.status, artifactsv1.RunStatus.RUN_STATUS_RUNNING);
    const runId = run!.runId;

    const restarted = await engram.runs.start({ runId });
    assert.equal(restarted.created, false);

    const appended = [];
    for (const step of [1, 2, 3]) {
      appended.push(await engram.events.append(runId, "tool.called", { tool: "search", step }));
    }
    assert.deepEqual(
      appended.map((a) => a.event!.seq),
      [1, 2, 3],
    );
    const retried = await engram.events.append(
      runId,
      "tool.called",
      { step: 9 },
      { requestId: "once" },
    );
    const again = await engram.events.append(
      runId,
      "tool.called",
      { step: 9 },
      { requestId: "once" },
    );
    assert.equal(retried.created, true);
    assert.equal(again.created, false);
    assert.equal(again.event!.seq, retried.event!.seq);

    const events = await collect(engram.events.list(runId, { afterSeq: 1, pageSize: 2 }));
    assert.deepEqual(
      events.map((event) => event.seq),
      [2, 3, 4],
    );
    assert.deepEqual(JSON.parse(events[0]!.payloadJson), { tool: "search", step: 2 });
    assert.equal(events[1]!.prevHash, events[0]!.hash, "each event links to the one before");

    const stopped = await engram.runs.stop(runId, "succeeded", "done");
    assert.equal(stopped.status, artifactsv1.RunStatus.RUN_STATUS_SUCCEEDED);
    const replayed = await collect(engram.events.replay(runId));
    assert.equal(replayed.length, 5);
    assert.equal(replayed.at(-1)!.type, "run.stopped");

    const error = await rejection(engram.runs.stop(runId, "failed"));
    assert.equal(error.codeName, "FAILED_PRECONDITION");
    const listed = await collect(engram.runs.list());
    assert.ok(listed.some((r) => r.runId === runId));
  });
});

describe("artifacts", () => {
  test("a streamed upload and download round-trip with the same SHA-256", async () => {
    const { run } = await engram.runs.start();
    const runId = run!.runId;
    const data = randomBytes(3 * 1024 * 1024 + 12_345);
    async function* uneven(): AsyncGenerator<Buffer> {
      for (let at = 0; at < data.length;) {
        const size = 1 + Math.floor(Math.random() * 300_000);
        yield data.subarray(at, at + size);
        at += size;
      }
    }
    const artifact = await engram.artifacts.upload(uneven(), {
      runId,
      stepId: "plan",
      name: "out/blob.bin",
      mimeType: "application/octet-stream",
      metadata: { kind: "test" },
      chunkSize: 256 * 1024,
    });
    assert.equal(artifact.hash, sha256(data));
    assert.equal(artifact.sizeBytes, data.length);
    assert.equal(
      artifact.path,
      `fleets/${FLEET}/runs/${runId}/plan/${artifact.artifactId}/out/blob.bin`,
    );

    const download = await engram.artifacts.download(artifact.artifactId, { chunkSize: 64 * 1024 });
    assert.equal(download.artifact.hash, artifact.hash);
    const chunks = await collect(download);
    assert.ok(chunks.length > 1, "the bytes arrive in several messages");
    assert.ok(Buffer.concat(chunks).equals(data));

    const file = join(scratch, "copy.bin");
    await engram.artifacts.downloadToFile(artifact.artifactId, file);
    assert.equal(sha256(readFileSync(file)), artifact.hash);

    const source = join(scratch, "notes.txt");
    writeFileSync(source, "tool output\n");
    const fromFile = await engram.artifacts.uploadFile(source, { runId, stepId: "act" });
    assert.equal(
      fromFile.path,
      `fleets/${FLEET}/runs/${runId}/act/${fromFile.artifactId}/notes.txt`,
    );
    assert.equal(
      (await engram.artifacts.readAll(fromFile.artifactId)).data.toString(),
      "tool output\n",
    );

    const taken = await rejection(
      engram.artifacts.upload("other bytes", { runId, stepId: "plan", name: "out/blob.bin" }),
    );
    assert.equal(taken.codeName, "ALREADY_EXISTS");
    assert.equal(taken.reason, "ARTIFACT_EXISTS");

    const wrongHash = await rejection(
      engram.artifacts.upload("abc", {
        runId,
        stepId: "plan",
        name: "checked.txt",
        expectedHash: "0".repeat(64),
      }),
    );
    assert.equal(wrongHash.codeName, "INVALID_ARGUMENT");

    const listed = await collect(engram.artifacts.list(runId));
    assert.deepEqual(
      listed.map((a) => a.artifactId).sort(),
      [artifact.artifactId, fromFile.artifactId].sort(),
    );
    const verified = await engram.artifacts.verify(runId);
    assert.equal(verified.checked, 2);
    assert.deepEqual(verified.problems, []);
  });

  test("a failing source cancels the upload and nothing is stored", async () => {
    const { run } = await engram.runs.start();
    async function* broken(): AsyncGenerator<Buffer> {
      yield Buffer.from("partial");
      throw new Error("disk went away");
    }
    await assert.rejects(
      engram.artifacts.upload(broken(), { runId: run!.runId, stepId: "s", name: "half.bin" }),
      /disk went away/,
    );
    assert.deepEqual(await collect(engram.artifacts.list(run!.runId)), []);
  });
});

describe("iterations", () => {
  test("record, reconstruct, list and verify", async () => {
    const runId = "iter-run";
    const detail = { notes: "first", metrics: { tokens: 812 } };
    const first = await engram.iterations.record(runId, {
      iteration: 1,
      planDigest: "p1",
      status: "ok",
      filesTouched: 2,
      detail,
      guardrails: { lint: "pass" },
    });
    assert.equal(first.created, true);
    assert.equal(first.summary!.iteration, 1);
    for (const iteration of [2, 3]) {
      await engram.iterations.record(runId, {
        iteration,
        planDigest: `p${iteration}`,
        parentDigest: `p${iteration - 1}`,
        status: "ok",
        detail: { notes: `iteration ${iteration}` },
      });
    }
    const next = await engram.iterations.record(
      runId,
      { planDigest: "p4", status: "ok" },
      { requestId: "iteration-four" },
    );
    const retried = await engram.iterations.record(
      runId,
      { planDigest: "p4", status: "ok" },
      { requestId: "iteration-four" },
    );
    assert.equal(next.summary!.iteration, 4);
    assert.equal(retried.created, false, "the same request_id does not append a fifth");
    assert.equal(retried.summary!.iteration, 4);

    const view = await engram.iterations.reconstruct(runId, 1);
    assert.equal(view.summary!.planDigest, "p1");
    assert.equal(view.source, compactorv1.DetailSource.DETAIL_SOURCE_HOT);
    assert.deepEqual(JSON.parse(view.detailJson), detail);
    assert.deepEqual(JSON.parse(view.guardrailsJson), { lint: "pass" });

    const summaries = await collect(engram.iterations.summaries(runId, { pageSize: 3 }));
    assert.deepEqual(
      summaries.map((s) => s.iteration),
      [1, 2, 3, 4],
    );
    assert.equal(summaries[1]!.prevHash, summaries[0]!.hash);
    const recent = await collect(engram.iterations.recent(runId));
    assert.equal(recent[0]!.summary!.iteration, 4);

    const verified = await engram.iterations.verify(runId);
    assert.equal(verified.ok, true);
    assert.equal(verified.lastIteration, 4);

    const missing = await rejection(engram.iterations.reconstruct(runId, 99));
    assert.equal(missing.codeName, "NOT_FOUND");
  });
});

describe("deadlines and raw clients", () => {
  test("a deadline shorter than the call expires as DEADLINE_EXCEEDED", async () => {
    // A new channel: connecting alone takes longer than 1 ms, let alone the search.
    const hurried = new EngramClient({ endpoints: stack.endpoints, token: stack.adminToken });
    try {
      const started = Date.now();
      const error = await rejection(hurried.records.search("anything", { timeoutMs: 1 }));
      assert.equal(error.codeName, "DEADLINE_EXCEEDED");
      assert.ok(Date.now() - started < 2000, "no retry after the deadline");
      // The channel is fine: the next call with the default deadline succeeds.
      assert.ok(Array.isArray(await hurried.records.search("anything")));
    } finally {
      hurried.close();
    }
  });

  test("a raw generated client carries the token", async () => {
    const admin = new EngramClient({ endpoints: stack.endpoints, token: stack.adminToken });
    try {
      const checkpoint = await new Promise((resolve, reject) =>
        admin.raw.governance.getChainCheckpoint({}, (error, response) =>
          error ? reject(error) : resolve(response),
        ),
      );
      assert.ok(checkpoint !== undefined);
    } finally {
      admin.close();
    }
  });
});
