/**
 * One service's channel, and the three call shapes the resources use, as promises
 * and async iterables. Every call made through a connection (raw clients included)
 * carries the bearer token and, unless the caller set one, the default deadline;
 * failures come back as EngramError.
 */
import * as grpc from "@grpc/grpc-js";
import { toEngramError } from "./errors.js";
import type { CallOptions, RetryOptions, TlsOptions } from "./options.js";
import { retryServiceConfig } from "./retry.js";

/** The parts of a generated method definition (`ShardServiceService.getRecord`) used here. */
export interface ServiceMethod<Req, Res> {
  readonly path: string;
  readonly requestStream: boolean;
  readonly responseStream: boolean;
  requestSerialize(value: Req): Buffer;
  responseDeserialize(value: Buffer): Res;
}

export interface ConnectionSettings {
  token: string | undefined;
  tls: TlsOptions | undefined;
  timeoutMs: number;
  streamTimeoutMs: number;
  retry: RetryOptions | false;
  channelOptions: grpc.ChannelOptions;
}

/** A generated client constructor (`ShardServiceClient`). */
export type GeneratedClientConstructor<C extends grpc.Client> = new (
  address: string,
  credentials: grpc.ChannelCredentials,
  options?: Partial<grpc.ClientOptions>,
) => C;

const MAX_RECEIVE_BYTES = 64 * 1024 * 1024;

export function channelCredentials(tls: TlsOptions | undefined): grpc.ChannelCredentials {
  if (tls === undefined) {
    return grpc.credentials.createInsecure();
  }
  if ((tls.cert === undefined) !== (tls.key === undefined)) {
    throw new TypeError(
      "a client certificate needs its private key and a key needs its certificate: " +
        "set both tls.cert and tls.key (ENGRAM_TLS_CERT and ENGRAM_TLS_KEY)",
    );
  }
  const pem = (value: Uint8Array | undefined): Buffer | null =>
    value === undefined ? null : Buffer.from(value);
  return grpc.credentials.createSsl(pem(tls.ca), pem(tls.key), pem(tls.cert));
}

/** Adds the bearer token, and the default deadline to a call that has none. */
function defaultsInterceptor(settings: ConnectionSettings): grpc.Interceptor {
  return (options, nextCall) => {
    const method = options.method_definition;
    const timeoutMs =
      method.requestStream || method.responseStream ? settings.streamTimeoutMs : settings.timeoutMs;
    const withDeadline =
      options.deadline === undefined && Number.isFinite(timeoutMs)
        ? { ...options, deadline: Date.now() + timeoutMs }
        : options;
    return new grpc.InterceptingCall(nextCall(withDeadline), {
      start(metadata, listener, next) {
        if (settings.token && metadata.get("authorization").length === 0) {
          metadata.set("authorization", `Bearer ${settings.token}`);
        }
        next(metadata, listener);
      },
    });
  };
}

function clientOptions(settings: ConnectionSettings, retries: boolean): grpc.ClientOptions {
  const serviceConfig = retries ? retryServiceConfig(settings.retry) : undefined;
  return {
    "grpc.primary_user_agent": "engram-ts",
    "grpc.max_receive_message_length": MAX_RECEIVE_BYTES,
    // The retry policy below is the whole service config: never take one from DNS.
    "grpc.service_config_disable_resolution": 1,
    ...(serviceConfig === undefined ? {} : { "grpc.service_config": serviceConfig }),
    ...settings.channelOptions,
    interceptors: [defaultsInterceptor(settings)],
  };
}

function callOptions(options: CallOptions): grpc.CallOptions {
  return options.timeoutMs === undefined ? {} : { deadline: Date.now() + options.timeoutMs };
}

/** Cancels `call` when `signal` aborts; returns the function that stops listening. */
function cancelOnAbort(signal: AbortSignal | undefined, call: grpc.Call): () => void {
  if (signal === undefined) {
    return () => {};
  }
  const cancel = (): void => call.cancel();
  if (signal.aborted) {
    cancel();
    return () => {};
  }
  signal.addEventListener("abort", cancel, { once: true });
  return () => signal.removeEventListener("abort", cancel);
}

/** Thrown into an upload's producer once the call has ended; the call's own error wins. */
class CallEnded extends Error {}

export class ServiceConnection {
  private readonly client: grpc.Client;

  constructor(
    readonly address: string,
    private readonly settings: ConnectionSettings,
  ) {
    this.client = new grpc.Client(
      address,
      channelCredentials(settings.tls),
      clientOptions(settings, true),
    );
  }

  /**
   * A generated client on a channel of its own, with the token and default deadline
   * but no retries: its requests may lack the request_id that makes a retry safe.
   */
  rawClient<C extends grpc.Client>(constructor: GeneratedClientConstructor<C>): C {
    return new constructor(
      this.address,
      channelCredentials(this.settings.tls),
      clientOptions(this.settings, false),
    );
  }

  unary<Req, Res>(
    method: ServiceMethod<Req, Res>,
    request: Req,
    options: CallOptions = {},
  ): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      let release = (): void => {};
      const call = this.client.makeUnaryRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        request,
        new grpc.Metadata(),
        callOptions(options),
        (error, response) => {
          release();
          if (error !== null || response === undefined) {
            reject(toEngramError(error ?? new Error("call ended without a response"), method.path));
          } else {
            resolve(response);
          }
        },
      );
      release = cancelOnAbort(options.signal, call);
    });
  }

  /** The call starts on the first `next()`; leaving the loop early cancels it. */
  async *serverStream<Req, Res>(
    method: ServiceMethod<Req, Res>,
    request: Req,
    options: CallOptions = {},
  ): AsyncGenerator<Res, void, undefined> {
    const call = this.client.makeServerStreamRequest(
      method.path,
      method.requestSerialize,
      method.responseDeserialize,
      request,
      new grpc.Metadata(),
      callOptions(options),
    );
    const release = cancelOnAbort(options.signal, call);
    try {
      for await (const message of call) {
        yield message as Res;
      }
    } catch (error) {
      throw toEngramError(error, method.path);
    } finally {
      release();
      call.cancel();
    }
  }

  /**
   * Runs `produce`, which sends the request messages with `send` (a promise that
   * waits while the transport is full), then half-closes and awaits the response.
   * If `produce` throws, the call is cancelled and its error is the result.
   */
  clientStream<Req, Res>(
    method: ServiceMethod<Req, Res>,
    produce: (send: (message: Req) => Promise<void>) => Promise<void>,
    options: CallOptions = {},
  ): Promise<Res> {
    return new Promise<Res>((resolve, reject) => {
      let ended = false;
      let wakeWriter = (): void => {};
      let release = (): void => {};
      const call = this.client.makeClientStreamRequest(
        method.path,
        method.requestSerialize,
        method.responseDeserialize,
        new grpc.Metadata(),
        callOptions(options),
        (error, response) => {
          ended = true;
          release();
          wakeWriter();
          if (error !== null || response === undefined) {
            reject(toEngramError(error ?? new Error("call ended without a response"), method.path));
          } else {
            resolve(response);
          }
        },
      );
      // The callback reports the call's failure; an unheard 'error' would crash Node.
      call.on("error", () => {});
      release = cancelOnAbort(options.signal, call);

      const send = async (message: Req): Promise<void> => {
        if (ended) {
          throw new CallEnded();
        }
        if (!call.write(message)) {
          await new Promise<void>((resume) => {
            wakeWriter = resume;
            call.once("drain", resume);
          });
          call.removeListener("drain", wakeWriter);
        }
      };
      produce(send).then(
        () => {
          if (!ended) {
            call.end();
          }
        },
        (error: unknown) => {
          if (!(error instanceof CallEnded)) {
            reject(error);
            call.cancel();
          }
        },
      );
    });
  }

  close(): void {
    this.client.close();
  }
}
