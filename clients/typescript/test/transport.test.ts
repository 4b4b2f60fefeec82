/**
 * Retries, deadlines, cancellation, error decoding, the bearer token and TLS, against
 * in-process fakes: each of these needs a service that fails on purpose.
 */
import assert from "node:assert/strict";
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import * as grpc from "@grpc/grpc-js";
import {
  artifactsv1,
  EngramClient,
  EngramError,
  isRetried,
  shardv1,
  Status,
} from "../src/index.js";
import { Any } from "../src/gen/google/protobuf/any.js";
import { ErrorInfo } from "../src/gen/google/rpc/error_details.js";
import { Status as RpcStatus } from "../src/gen/google/rpc/status.js";
import { type FakeServer, startFakeServer } from "./support/fake-server.js";
import { tlsFixtures } from "./support/paths.js";

type Handlers = Partial<Record<string, grpc.UntypedHandleCall>>;

function serverError(code: grpc.status, details: string, metadata = new grpc.Metadata()) {
  return Object.assign(new Error(details), { code, details, metadata });
}

const record = (requestId: string): shardv1.CreateRecordResponse =>
  shardv1.CreateRecordResponse.fromPartial({
    record: { id: "r1", content: "hello", metadata: { requestId } },
    created: true,
  });

function shardWith(handlers: Handlers): (server: grpc.Server) => void {
  return (server) =>
    server.addService(
      shardv1.ShardServiceService,
      handlers as unknown as grpc.UntypedServiceImplementation,
    );
}

async function rejection(promise: Promise<unknown>): Promise<EngramError> {
  try {
    await promise;
  } catch (error) {
    assert.ok(error instanceof EngramError, `expected an EngramError, got ${String(error)}`);
    return error;
  }
  assert.fail("the call succeeded");
}

const fastRetry = { initialBackoffMs: 10, maxBackoffMs: 50 };

describe("retries", () => {
  test("a write failing UNAVAILABLE is retried with the same request_id", async () => {
    const seen: string[] = [];
    const server = await startFakeServer(
      shardWith({
        createRecord: ((call, callback) => {
          seen.push(call.request.requestId);
          if (seen.length < 3) {
            callback(serverError(Status.UNAVAILABLE, "governance unreachable; nothing stored"));
          } else {
            callback(null, record(call.request.requestId));
          }
        }) as grpc.handleUnaryCall<shardv1.CreateRecordRequest, shardv1.CreateRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address }, retry: fastRetry });
    try {
      const written = await engram.records.add("hello");
      assert.equal(seen.length, 3);
      assert.match(seen[0]!, /^[0-9a-f-]{36}$/);
      assert.deepEqual(new Set(seen).size, 1, "every attempt carries the first request_id");
      assert.equal(written.record?.metadata.requestId, seen[0]);
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("a call a stopping server cancelled before starting it is retried", async () => {
    let attempts = 0;
    const server = await startFakeServer(
      shardWith({
        createRecord: ((call, callback) => {
          attempts += 1;
          if (attempts === 1) {
            callback(serverError(Status.CANCELLED, "server shutting down"));
          } else {
            callback(null, record(call.request.requestId));
          }
        }) as grpc.handleUnaryCall<shardv1.CreateRecordRequest, shardv1.CreateRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address }, retry: fastRetry });
    try {
      await engram.records.add("hello");
      assert.equal(attempts, 2);
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("two logical writes get two request_ids", async () => {
    const seen: string[] = [];
    const server = await startFakeServer(
      shardWith({
        createRecord: ((call, callback) => {
          seen.push(call.request.requestId);
          callback(null, record(call.request.requestId));
        }) as grpc.handleUnaryCall<shardv1.CreateRecordRequest, shardv1.CreateRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address } });
    try {
      await engram.records.add("a");
      await engram.records.add("a");
      await engram.records.add("a", {}, { requestId: "mine" });
      assert.equal(seen.length, 3);
      assert.notEqual(seen[0], seen[1]);
      assert.equal(seen[2], "mine");
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("a call whose retry could act twice is not retried", async () => {
    let attempts = 0;
    const server = await startFakeServer((s) =>
      s.addService(artifactsv1.ArtifactsServiceService, {
        stopRun: ((_call, callback) => {
          attempts += 1;
          callback(serverError(Status.UNAVAILABLE, "try later"));
        }) as grpc.handleUnaryCall<artifactsv1.StopRunRequest, artifactsv1.StopRunResponse>,
      } as unknown as grpc.UntypedServiceImplementation),
    );
    const engram = new EngramClient({ endpoints: { artifacts: server.address }, retry: fastRetry });
    try {
      const error = await rejection(engram.runs.stop("run-1", "succeeded"));
      assert.equal(error.codeName, "UNAVAILABLE");
      assert.equal(attempts, 1);
      assert.equal(isRetried(artifactsv1.ArtifactsServiceService.stopRun.path), false);
      assert.equal(isRetried(artifactsv1.ArtifactsServiceService.appendEvent.path), true);
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("retry: false makes one attempt", async () => {
    let attempts = 0;
    const server = await startFakeServer(
      shardWith({
        getRecord: ((_call, callback) => {
          attempts += 1;
          callback(serverError(Status.UNAVAILABLE, "down"));
        }) as grpc.handleUnaryCall<shardv1.GetRecordRequest, shardv1.GetRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address }, retry: false });
    try {
      assert.equal((await rejection(engram.records.get("r1"))).codeName, "UNAVAILABLE");
      assert.equal(attempts, 1);
    } finally {
      engram.close();
      await server.stop();
    }
  });
});

describe("deadlines and cancellation", () => {
  let server: FakeServer;
  const stalled: Array<() => void> = [];

  before(async () => {
    server = await startFakeServer(
      shardWith({
        // Never answers: only the client's deadline or cancellation ends the call.
        getRecord: ((_call, callback) => {
          stalled.push(() => callback(serverError(Status.UNAVAILABLE, "stopping")));
        }) as grpc.handleUnaryCall<shardv1.GetRecordRequest, shardv1.GetRecordResponse>,
      }),
    );
  });
  after(async () => {
    stalled.forEach((end) => end());
    await server.stop();
  });

  test("the client's default deadline expires as DEADLINE_EXCEEDED", async () => {
    const engram = new EngramClient({ endpoints: { shard: server.address }, timeoutMs: 200 });
    try {
      const started = Date.now();
      const error = await rejection(engram.records.get("r1"));
      const elapsed = Date.now() - started;
      assert.equal(error.code, Status.DEADLINE_EXCEEDED);
      assert.equal(error.codeName, "DEADLINE_EXCEEDED");
      assert.equal(error.reason, "");
      assert.ok(elapsed >= 150 && elapsed < 5000, `took ${elapsed} ms`);
    } finally {
      engram.close();
    }
  });

  test("a call's own timeoutMs overrides the client's", async () => {
    const engram = new EngramClient({ endpoints: { shard: server.address }, timeoutMs: 60_000 });
    try {
      const started = Date.now();
      const error = await rejection(engram.records.get("r1", { timeoutMs: 100 }));
      assert.equal(error.codeName, "DEADLINE_EXCEEDED");
      assert.ok(Date.now() - started < 5000);
    } finally {
      engram.close();
    }
  });

  test("the raw clients get the default deadline too", async () => {
    const engram = new EngramClient({ endpoints: { shard: server.address }, timeoutMs: 100 });
    try {
      const error = await new Promise<grpc.ServiceError>((resolve) =>
        engram.raw.shard.getRecord({ id: "r1" }, (err) => resolve(err!)),
      );
      assert.equal(error.code, Status.DEADLINE_EXCEEDED);
    } finally {
      engram.close();
    }
  });

  test("aborting the signal cancels the call", async () => {
    const engram = new EngramClient({ endpoints: { shard: server.address } });
    try {
      const controller = new AbortController();
      const pending = engram.records.get("r1", { signal: controller.signal });
      setTimeout(() => controller.abort(), 50);
      assert.equal((await rejection(pending)).codeName, "CANCELLED");
    } finally {
      engram.close();
    }
  });
});

describe("errors and metadata", () => {
  test("ErrorInfo is decoded from grpc-status-details-bin", async () => {
    const info = ErrorInfo.fromPartial({
      reason: "IMPORTANCE_OUT_OF_RANGE",
      domain: "engram.dev",
      metadata: { field: "importance" },
    });
    const details = RpcStatus.encode(
      RpcStatus.fromPartial({
        code: Status.INVALID_ARGUMENT,
        message: "importance must be between 0 and 1, got 3.0",
        details: [
          Any.fromPartial({
            typeUrl: "type.googleapis.com/google.rpc.DebugInfo",
            value: Buffer.from([]),
          }),
          Any.fromPartial({
            typeUrl: "type.googleapis.com/google.rpc.ErrorInfo",
            value: Buffer.from(ErrorInfo.encode(info).finish()),
          }),
        ],
      }),
    ).finish();
    let authorization: grpc.MetadataValue[] = [];
    const server = await startFakeServer(
      shardWith({
        createRecord: ((call, callback) => {
          authorization = call.metadata.get("authorization");
          const trailer = new grpc.Metadata();
          trailer.set("grpc-status-details-bin", Buffer.from(details));
          callback(
            serverError(
              Status.INVALID_ARGUMENT,
              "importance must be between 0 and 1, got 3.0",
              trailer,
            ),
          );
        }) as grpc.handleUnaryCall<shardv1.CreateRecordRequest, shardv1.CreateRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address }, token: "t0ken" });
    try {
      const error = await rejection(engram.records.add("x", { importance: 3 }));
      assert.deepEqual(authorization, ["Bearer t0ken"]);
      assert.equal(error.code, Status.INVALID_ARGUMENT);
      assert.equal(error.codeName, "INVALID_ARGUMENT");
      assert.equal(error.statusMessage, "importance must be between 0 and 1, got 3.0");
      assert.equal(error.reason, "IMPORTANCE_OUT_OF_RANGE");
      assert.equal(error.domain, "engram.dev");
      assert.deepEqual({ ...error.metadata }, { field: "importance" });
      assert.equal(error.details.length, 2);
      assert.equal(error.method, "/engram.shard.v1.ShardService/CreateRecord");
      assert.equal(
        error.message,
        "INVALID_ARGUMENT: importance must be between 0 and 1, got 3.0 [IMPORTANCE_OUT_OF_RANGE]",
      );
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("a malformed trailer still yields the status code", async () => {
    const server = await startFakeServer(
      shardWith({
        getRecord: ((_call, callback) => {
          const trailer = new grpc.Metadata();
          trailer.set("grpc-status-details-bin", Buffer.from([0xff, 0xff, 0xff]));
          callback(serverError(Status.NOT_FOUND, "no record r1", trailer));
        }) as grpc.handleUnaryCall<shardv1.GetRecordRequest, shardv1.GetRecordResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address } });
    try {
      const error = await rejection(engram.records.get("r1"));
      assert.equal(error.codeName, "NOT_FOUND");
      assert.equal(error.reason, "");
      assert.equal(error.message, "NOT_FOUND: no record r1");
    } finally {
      engram.close();
      await server.stop();
    }
  });

  test("no token, no authorization header", async () => {
    let authorization: grpc.MetadataValue[] = ["unset"];
    const server = await startFakeServer(
      shardWith({
        getStatus: ((call, callback) => {
          authorization = call.metadata.get("authorization");
          callback(null, shardv1.GetStatusResponse.fromPartial({ fleetId: "f" }));
        }) as grpc.handleUnaryCall<shardv1.GetStatusRequest, shardv1.GetStatusResponse>,
      }),
    );
    const engram = new EngramClient({ endpoints: { shard: server.address } });
    try {
      assert.equal((await engram.records.status()).fleetId, "f");
      assert.deepEqual(authorization, []);
    } finally {
      engram.close();
      await server.stop();
    }
  });
});

describe("TLS", () => {
  const pem = (name: string): Buffer => readFileSync(join(tlsFixtures, name));
  let server: FakeServer;
  let authorization: grpc.MetadataValue[] = [];

  before(async () => {
    const credentials = grpc.ServerCredentials.createSsl(
      pem("ca.pem"),
      [{ private_key: pem("server.key"), cert_chain: pem("server.pem") }],
      true, // mutual TLS: a client certificate signed by the CA is required
    );
    server = await startFakeServer(
      shardWith({
        getStatus: ((call, callback) => {
          authorization = call.metadata.get("authorization");
          callback(null, shardv1.GetStatusResponse.fromPartial({ fleetId: "tls-fleet" }));
        }) as grpc.handleUnaryCall<shardv1.GetStatusRequest, shardv1.GetStatusResponse>,
      }),
      credentials,
    );
  });
  after(() => server.stop());
  // The server certificate names localhost and 127.0.0.1; TLS checks a name, not an IP.
  const address = (): string => server.address.replace("127.0.0.1", "localhost");

  test("mutual TLS with the CA, a client certificate and its key", async () => {
    const engram = new EngramClient({
      endpoints: { shard: address() },
      token: "tls-token",
      tls: { ca: pem("ca.pem"), cert: pem("client.pem"), key: pem("client.key") },
    });
    try {
      assert.equal((await engram.records.status()).fleetId, "tls-fleet");
      assert.deepEqual(authorization, ["Bearer tls-token"]);
    } finally {
      engram.close();
    }
  });

  test("a server that requires a client certificate refuses a caller without one", async () => {
    const engram = new EngramClient({
      endpoints: { shard: address() },
      tls: { ca: pem("ca.pem") },
      retry: false,
    });
    try {
      assert.equal((await rejection(engram.records.status())).codeName, "UNAVAILABLE");
    } finally {
      engram.close();
    }
  });

  test("a certificate without its key is refused when the client is made", () => {
    assert.throws(
      () => new EngramClient({ tls: { ca: pem("ca.pem"), cert: pem("client.pem") } }),
      /needs its private key/,
    );
  });
});
