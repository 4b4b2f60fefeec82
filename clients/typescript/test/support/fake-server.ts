/** An in-process gRPC server on 127.0.0.1 for the tests that need a misbehaving service. */
import * as grpc from "@grpc/grpc-js";

export interface FakeServer {
  address: string;
  stop(): Promise<void>;
}

export async function startFakeServer(
  register: (server: grpc.Server) => void,
  credentials: grpc.ServerCredentials = grpc.ServerCredentials.createInsecure(),
): Promise<FakeServer> {
  const server = new grpc.Server();
  register(server);
  const port = await new Promise<number>((resolve, reject) => {
    server.bindAsync("127.0.0.1:0", credentials, (error, bound) =>
      error ? reject(error) : resolve(bound),
    );
  });
  return {
    address: `127.0.0.1:${port}`,
    stop: () =>
      new Promise<void>((resolve) => {
        server.tryShutdown(() => resolve());
        // Calls the tests left hanging must not hold the suite open.
        setTimeout(() => server.forceShutdown(), 200).unref();
      }),
  };
}

/** A service error carrying a grpc-status-details-bin trailer. */
export function serviceError(
  code: grpc.status,
  details: string,
  statusDetails?: Uint8Array,
): Partial<grpc.StatusObject> {
  const metadata = new grpc.Metadata();
  if (statusDetails !== undefined) {
    metadata.set("grpc-status-details-bin", Buffer.from(statusDetails));
  }
  return { code, details, metadata };
}
