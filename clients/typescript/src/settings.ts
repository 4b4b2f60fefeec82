/**
 * ClientOptions from ENGRAM_* variables, the way the `engram` CLI and the Python SDK
 * read them: an address set in the environment wins over $ENGRAM_HOME/endpoints.json
 * (written by `engram up`), which wins over the default ports; the token is
 * ENGRAM_TOKEN, else the admin token `engram up` wrote. Call it once, in `main`.
 */
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import {
  type ClientOptions,
  DEFAULT_ENDPOINTS,
  type Endpoints,
  type ServiceName,
  type TlsOptions,
} from "./options.js";

type Environment = { readonly [name: string]: string | undefined };

const SERVICES = Object.keys(DEFAULT_ENDPOINTS) as ServiceName[];

function endpointsFile(home: string): Endpoints {
  const path = join(home, "endpoints.json");
  if (!existsSync(path)) {
    return {};
  }
  try {
    const parsed: unknown = JSON.parse(readFileSync(path, "utf8"));
    const endpoints: Endpoints = {};
    for (const service of SERVICES) {
      const address = (parsed as Record<string, unknown>)[service];
      if (typeof address === "string") {
        endpoints[service] = address;
      }
    }
    return endpoints;
  } catch {
    // As the Python SDK does: an unreadable file is no file.
    return {};
  }
}

function tlsFromEnv(env: Environment): TlsOptions | undefined {
  const { ENGRAM_TLS_CA: ca, ENGRAM_TLS_CERT: cert, ENGRAM_TLS_KEY: key } = env;
  if (!ca && !cert && !key) {
    return undefined;
  }
  if (!cert !== !key) {
    throw new TypeError(
      "a client certificate needs its private key and a key needs its certificate: " +
        "set both ENGRAM_TLS_CERT and ENGRAM_TLS_KEY",
    );
  }
  if (!ca) {
    throw new TypeError(
      "a client certificate (mutual TLS) also needs the CA that signed the server's " +
        "certificate: set ENGRAM_TLS_CA",
    );
  }
  return {
    ca: readFileSync(ca),
    ...(cert && key ? { cert: readFileSync(cert), key: readFileSync(key) } : {}),
  };
}

export function settingsFromEnv(env: Environment = process.env): ClientOptions {
  const home = env.ENGRAM_HOME || ".engram";
  const fromFile = endpointsFile(home);
  const endpoints: Endpoints = {};
  for (const service of SERVICES) {
    const prefix = `ENGRAM_${service.toUpperCase()}`;
    endpoints[service] =
      env[`${prefix}_ADDR`] ||
      env[`${prefix}_TARGET`] ||
      fromFile[service] ||
      DEFAULT_ENDPOINTS[service];
  }
  const adminToken = join(home, "auth", "admin.token");
  // Trimmed as the admin token file is: a Secret made --from-file keeps its newline, which
  // gRPC refuses as metadata.
  const token =
    env.ENGRAM_TOKEN?.trim() ||
    (existsSync(adminToken) ? readFileSync(adminToken, "utf8").trim() : undefined);
  const options: ClientOptions = { endpoints };
  if (token) {
    options.token = token;
  }
  const tls = tlsFromEnv(env);
  if (tls) {
    options.tls = tls;
  }
  if (env.ENGRAM_TIMEOUT_SECONDS) {
    options.timeoutMs = Number(env.ENGRAM_TIMEOUT_SECONDS) * 1000;
  }
  return options;
}
