/** settingsFromEnv and the checks EngramClient makes before any call. */
import assert from "node:assert/strict";
import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { after, before, describe, test } from "node:test";
import { DEFAULT_ENDPOINTS, EngramClient, settingsFromEnv } from "../src/index.js";
import { tlsFixtures } from "./support/paths.js";

describe("settingsFromEnv", () => {
  let home: string;

  before(() => {
    home = mkdtempSync(join(tmpdir(), "engram-ts-home-"));
    writeFileSync(
      join(home, "endpoints.json"),
      JSON.stringify({ shard: "127.0.0.1:41000", artifacts: "127.0.0.1:41002", extra: 1 }),
    );
    mkdirSync(join(home, "auth"));
    writeFileSync(join(home, "auth", "admin.token"), "admin-token\n");
  });
  after(() => rmSync(home, { recursive: true, force: true }));

  test("environment, then endpoints.json, then the default ports", () => {
    const options = settingsFromEnv({
      ENGRAM_HOME: home,
      ENGRAM_ARTIFACTS_ADDR: "artifacts.internal:443",
    });
    assert.deepEqual(options.endpoints, {
      shard: "127.0.0.1:41000",
      governance: DEFAULT_ENDPOINTS.governance,
      artifacts: "artifacts.internal:443",
      compactor: DEFAULT_ENDPOINTS.compactor,
    });
    assert.equal(options.token, "admin-token");
    assert.equal(options.tls, undefined);
  });

  test("ENGRAM_TOKEN wins over the admin token; ENGRAM_TIMEOUT_SECONDS sets the deadline", () => {
    const options = settingsFromEnv({
      ENGRAM_HOME: home,
      ENGRAM_TOKEN: "agent-token",
      ENGRAM_TIMEOUT_SECONDS: "2.5",
    });
    assert.equal(options.token, "agent-token");
    assert.equal(options.timeoutMs, 2500);
  });

  test("ENGRAM_TOKEN is trimmed, as the admin token file is", () => {
    const env = { ENGRAM_HOME: join(home, "missing"), ENGRAM_TOKEN: "agent-token\n" };
    assert.equal(settingsFromEnv(env).token, "agent-token");
    assert.equal(settingsFromEnv({ ...env, ENGRAM_TOKEN: " \n" }).token, undefined);
  });

  test("a home without files gives the default ports and no token", () => {
    const options = settingsFromEnv({ ENGRAM_HOME: join(home, "missing") });
    assert.deepEqual(options.endpoints, DEFAULT_ENDPOINTS);
    assert.equal(options.token, undefined);
  });

  test("TLS files are read; a certificate needs its key and the CA", () => {
    const options = settingsFromEnv({
      ENGRAM_HOME: home,
      ENGRAM_TLS_CA: join(tlsFixtures, "ca.pem"),
      ENGRAM_TLS_CERT: join(tlsFixtures, "client.pem"),
      ENGRAM_TLS_KEY: join(tlsFixtures, "client.key"),
    });
    assert.match(Buffer.from(options.tls!.ca!).toString(), /BEGIN CERTIFICATE/);
    assert.match(Buffer.from(options.tls!.key!).toString(), /PRIVATE KEY/);
    assert.throws(
      () => settingsFromEnv({ ENGRAM_TLS_CA: "ca.pem", ENGRAM_TLS_CERT: "client.pem" }),
      /ENGRAM_TLS_CERT and ENGRAM_TLS_KEY/,
    );
    assert.throws(
      () => settingsFromEnv({ ENGRAM_TLS_CERT: "client.pem", ENGRAM_TLS_KEY: "client.key" }),
      /ENGRAM_TLS_CA/,
    );
  });
});

describe("EngramClient options", () => {
  test("bad deadlines and retry policies are refused when the client is made", () => {
    assert.throws(() => new EngramClient({ timeoutMs: 0 }), /timeoutMs/);
    assert.throws(() => new EngramClient({ streamTimeoutMs: -1 }), /streamTimeoutMs/);
    assert.throws(() => new EngramClient({ retry: { maxAttempts: 6 } }), /maxAttempts/);
    assert.throws(() => new EngramClient({ retry: { initialBackoffMs: 0 } }), /initialBackoffMs/);
    new EngramClient({ retry: { maxAttempts: 1 }, timeoutMs: Infinity }).close();
  });

  test("a resource whose service has no endpoint says which one", async () => {
    const engram = new EngramClient({ endpoints: { shard: "127.0.0.1:1" } });
    await assert.rejects(engram.iterations.verify("run"), /no endpoint for the compactor service/);
    engram.close();
  });
});
