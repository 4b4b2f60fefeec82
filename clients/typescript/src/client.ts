/** EngramClient: one object for the four services, grouped by what the caller works on. */
import type * as grpc from "@grpc/grpc-js";
import { ArtifactStore } from "./artifacts.js";
import {
  channelCredentials,
  type ConnectionSettings,
  type GeneratedClientConstructor,
  ServiceConnection,
} from "./connection.js";
import { Events } from "./events.js";
import { ArtifactsServiceClient } from "./gen/engram/artifacts/v1/artifacts_service.js";
import { CompactorServiceClient } from "./gen/engram/compactor/v1/compactor_service.js";
import { GovernanceServiceClient } from "./gen/engram/governance/v1/governance_service.js";
import { ShardServiceClient } from "./gen/engram/shard/v1/shard_service.js";
import { Iterations } from "./iterations.js";
import {
  type ClientOptions,
  DEFAULT_ENDPOINTS,
  DEFAULT_RETRY,
  DEFAULT_STREAM_TIMEOUT_MS,
  DEFAULT_TIMEOUT_MS,
  type Endpoints,
  type ServiceName,
} from "./options.js";
import { Records } from "./records.js";
import { retryServiceConfig } from "./retry.js";
import { Runs } from "./runs.js";

/** The generated clients, for calls the resources do not wrap (governance, admin). */
export interface RawClients {
  readonly shard: ShardServiceClient;
  readonly governance: GovernanceServiceClient;
  readonly artifacts: ArtifactsServiceClient;
  readonly compactor: CompactorServiceClient;
}

function positiveMs(name: string, value: number): number {
  if (!(value > 0)) {
    throw new RangeError(
      `${name} must be a positive number of milliseconds (or Infinity), got ${value}`,
    );
  }
  return value;
}

export class EngramClient {
  readonly records: Records;
  readonly runs: Runs;
  readonly events: Events;
  readonly artifacts: ArtifactStore;
  readonly iterations: Iterations;

  private readonly endpoints: Readonly<Endpoints>;
  private readonly settings: ConnectionSettings;
  private readonly connections = new Map<ServiceName, ServiceConnection>();
  private readonly rawClients = new Map<ServiceName, grpc.Client>();

  /**
   * Channels open on first use. `endpoints` absent: the ports `engram up` uses by
   * default; see `settingsFromEnv` for ENGRAM_* variables and endpoints.json.
   */
  constructor(options: ClientOptions = {}) {
    this.endpoints = Object.freeze({ ...(options.endpoints ?? DEFAULT_ENDPOINTS) });
    this.settings = {
      token: options.token,
      tls: options.tls,
      timeoutMs: positiveMs("timeoutMs", options.timeoutMs ?? DEFAULT_TIMEOUT_MS),
      streamTimeoutMs: positiveMs(
        "streamTimeoutMs",
        options.streamTimeoutMs ?? DEFAULT_STREAM_TIMEOUT_MS,
      ),
      retry: options.retry === false ? false : { ...DEFAULT_RETRY, ...options.retry },
      channelOptions: options.channelOptions ?? {},
    };
    // Refuse a certificate without its key, or a bad retry policy, now rather than on first use.
    channelCredentials(this.settings.tls);
    retryServiceConfig(this.settings.retry);
    const connection = (service: ServiceName) => () => this.connection(service);
    this.records = new Records(connection("shard"));
    this.runs = new Runs(connection("artifacts"));
    this.events = new Events(connection("artifacts"));
    this.artifacts = new ArtifactStore(connection("artifacts"));
    this.iterations = new Iterations(connection("compactor"));
  }

  /** Generated clients with the token and default deadlines, but no retries. */
  get raw(): RawClients {
    const raw = <C extends grpc.Client>(
      service: ServiceName,
      constructor: GeneratedClientConstructor<C>,
    ): C => {
      let client = this.rawClients.get(service);
      if (client === undefined) {
        client = this.connection(service).rawClient(constructor);
        this.rawClients.set(service, client);
      }
      return client as C;
    };
    return {
      get shard() {
        return raw("shard", ShardServiceClient);
      },
      get governance() {
        return raw("governance", GovernanceServiceClient);
      },
      get artifacts() {
        return raw("artifacts", ArtifactsServiceClient);
      },
      get compactor() {
        return raw("compactor", CompactorServiceClient);
      },
    };
  }

  /** Closes every channel; calls in flight fail with CANCELLED or UNAVAILABLE. */
  close(): void {
    for (const connection of this.connections.values()) {
      connection.close();
    }
    for (const client of this.rawClients.values()) {
      client.close();
    }
    this.connections.clear();
    this.rawClients.clear();
  }

  private connection(service: ServiceName): ServiceConnection {
    let connection = this.connections.get(service);
    if (connection === undefined) {
      const address = this.endpoints[service];
      if (address === undefined) {
        throw new TypeError(`no endpoint for the ${service} service: set endpoints.${service}`);
      }
      connection = new ServiceConnection(address, this.settings);
      this.connections.set(service, connection);
    }
    return connection;
  }
}
