/**
 * The Python services, started for the integration tests: `engram up --base-port P`
 * in a temporary ENGRAM_HOME, waited for until all four report SERVING, stopped with
 * SIGTERM. The `engram` command comes from <repo>/.venv/bin, or from ENGRAM_PYTHON_BIN
 * (that venv's bin directory, or the `engram` executable itself).
 */
import { type ChildProcess, execFile, spawn } from "node:child_process";
import { existsSync, mkdtempSync, readFileSync, rmSync, statSync } from "node:fs";
import { createServer } from "node:net";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { promisify } from "node:util";
import * as grpc from "@grpc/grpc-js";
import { BinaryReader } from "@bufbuild/protobuf/wire";
import type { Endpoints, ServiceName } from "../../src/index.js";
import { repoRoot } from "./paths.js";

const SERVICES: ServiceName[] = ["shard", "governance", "artifacts", "compactor"];
/** `engram up` puts the gRPC ports at base..base+3 and the metrics ports at base+10..base+13. */
const PORT_OFFSETS = [0, 1, 2, 3, 10, 11, 12, 13];
const START_TIMEOUT_MS = 120_000;
const SERVING = 1;

export interface Stack {
  home: string;
  endpoints: Endpoints;
  /** admin + governor of fleet "default". */
  adminToken: string;
  /** A new agent token (role agent) for `agent` in `fleet`. */
  agentToken(agent: string, fleet: string): Promise<string>;
  stop(): Promise<void>;
}

export function engramCommand(): string {
  const configured = process.env.ENGRAM_PYTHON_BIN;
  const location = configured || join(repoRoot, ".venv", "bin");
  const command =
    existsSync(location) && statSync(location).isDirectory() ? join(location, "engram") : location;
  if (!existsSync(command)) {
    throw new Error(
      `no engram command at ${command}: run \`make setup\` at the repository root, or set ` +
        "ENGRAM_PYTHON_BIN to the bin directory of a venv that has engram[server] installed",
    );
  }
  return command;
}

function portFree(port: number): Promise<boolean> {
  return new Promise((resolve) => {
    const server = createServer();
    server.once("error", () => resolve(false));
    server.listen(port, "127.0.0.1", () => server.close(() => resolve(true)));
  });
}

async function freeBasePort(): Promise<number> {
  for (let tries = 0; tries < 50; tries += 1) {
    // Below Linux's ephemeral range (32768-60999): a port found free there can be taken as
    // the local port of any outgoing connection before `engram up` binds it (seen in CI:
    // the compactor's "Address already in use").
    const base = 20_000 + Math.floor(Math.random() * 12_700);
    const free = await Promise.all(PORT_OFFSETS.map((offset) => portFree(base + offset)));
    if (free.every(Boolean)) {
      return base;
    }
  }
  throw new Error("found no 14 free ports on 127.0.0.1");
}

/** grpc.health.v1.Health/Check with an empty service name; true once SERVING. */
function serving(address: string): Promise<boolean> {
  const client = new grpc.Client(address, grpc.credentials.createInsecure());
  return new Promise<boolean>((resolve) => {
    client.makeUnaryRequest(
      "/grpc.health.v1.Health/Check",
      () => Buffer.alloc(0),
      (bytes: Buffer) => {
        const reader = new BinaryReader(bytes);
        let status = 0;
        while (reader.pos < reader.len) {
          const [field, wireType] = reader.tag();
          if (field === 1) {
            status = reader.int32();
          } else {
            reader.skip(wireType);
          }
        }
        return status;
      },
      {},
      new grpc.Metadata(),
      { deadline: Date.now() + 1000 },
      (error, status) => resolve(error === null && status === SERVING),
    );
  }).finally(() => client.close());
}

function exited(child: ChildProcess): Promise<void> {
  return child.exitCode !== null || child.signalCode !== null
    ? Promise.resolve()
    : new Promise((resolve) => child.once("exit", () => resolve()));
}

function logTails(home: string): string {
  return SERVICES.map((service) => {
    const path = join(home, "logs", `${service}.log`);
    const lines = existsSync(path) ? readFileSync(path, "utf8").trimEnd().split("\n") : [];
    return `--- ${service}.log ---\n${lines.slice(-15).join("\n")}`;
  }).join("\n");
}

export async function startStack(): Promise<Stack> {
  const engram = engramCommand();
  const home = mkdtempSync(join(tmpdir(), "engram-ts-"));
  const base = await freeBasePort();
  const env = {
    ...process.env,
    ENGRAM_HOME: home,
    // The client is under test, not retrieval: lexical search starts in seconds.
    ENGRAM_SHARD_EMBEDDER: "none",
  };
  const child = spawn(engram, ["up", "--base-port", String(base)], {
    env,
    stdio: ["ignore", "pipe", "pipe"],
  });
  // Should the test process end without stopping the stack, the services go with it.
  const killOnExit = (): void => void child.kill("SIGTERM");
  process.once("exit", killOnExit);
  let output = "";
  child.stdout.on("data", (chunk: Buffer) => (output += chunk.toString()));
  child.stderr.on("data", (chunk: Buffer) => (output += chunk.toString()));

  const endpoints: Endpoints = {};
  const order: ServiceName[] = ["shard", "governance", "artifacts", "compactor"];
  order.forEach((service, index) => (endpoints[service] = `127.0.0.1:${base + index}`));

  const stop = async (): Promise<void> => {
    process.removeListener("exit", killOnExit);
    if (child.exitCode === null && child.signalCode === null) {
      child.kill("SIGTERM");
      const killer = setTimeout(() => child.kill("SIGKILL"), 30_000);
      await exited(child);
      clearTimeout(killer);
    }
    rmSync(home, { recursive: true, force: true });
  };

  const deadline = Date.now() + START_TIMEOUT_MS;
  const pending = new Set(SERVICES);
  while (pending.size > 0) {
    if (child.exitCode !== null || Date.now() > deadline) {
      const why = child.exitCode !== null ? `exited with ${child.exitCode}` : "timed out";
      const logs = logTails(home);
      await stop();
      throw new Error(`engram up ${why}\n${output}\n${logs}`);
    }
    for (const service of [...pending]) {
      if (await serving(endpoints[service]!)) {
        pending.delete(service);
      }
    }
    if (pending.size > 0) {
      await new Promise((resolve) => setTimeout(resolve, 250));
    }
  }

  const adminToken = readFileSync(join(home, "auth", "admin.token"), "utf8").trim();
  const agentToken = async (agent: string, fleet: string): Promise<string> => {
    const { stdout } = await promisify(execFile)(
      engram,
      ["token", "create", "--agent", agent, "--fleet", fleet],
      { env },
    );
    return stdout.trim();
  };
  return { home, endpoints, adminToken, agentToken, stop };
}
