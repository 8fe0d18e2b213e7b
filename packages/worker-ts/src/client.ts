// Channels and typed calls for the awooop services, as the Python SDK's Client opens them:
// - retries: the channel's service config retries UNAVAILABLE only (a refused connection, a
//   draining server, STORE_UNAVAILABLE), 4 attempts with backoff 0.1 s doubling to 2 s; every
//   other status is an answer;
// - balancing: round_robin over every address of the target;
// - deadlines: every call gets one; auth: `authorization: Bearer <key>` on every call;
// - tracing: a call made inside a span carries it as `traceparent` (tracing.ts).
import { readFileSync } from "node:fs";
import {
  ChannelCredentials,
  Metadata,
  credentials,
  type CallOptions,
  type ChannelOptions,
  type ClientUnaryCall,
  type ServiceError,
} from "@grpc/grpc-js";
import { AwooopError } from "./errors";
import { SagaServiceClient } from "./gen/awooop/saga/v1/saga";
import { SchedulerServiceClient } from "./gen/awooop/scheduler/v1/scheduler";
import { ToolGatewayServiceClient } from "./gen/awooop/tools/v1/tools";
import { address, apiKey, channelTarget, tlsFromEnv } from "./settings";
import { activeTraceparent } from "./tracing";

export const DEFAULT_TIMEOUT = 10; // seconds

const SERVICE_CONFIG = {
  loadBalancingConfig: [{ round_robin: {} }],
  methodConfig: [
    {
      name: [{}], // every method of every service
      retryPolicy: {
        maxAttempts: 4,
        initialBackoff: "0.1s",
        maxBackoff: "2s",
        backoffMultiplier: 2,
        retryableStatusCodes: ["UNAVAILABLE"],
      },
    },
  ],
};

export const CHANNEL_OPTIONS: ChannelOptions = {
  "grpc.enable_retries": 1,
  "grpc.service_config": JSON.stringify(SERVICE_CONFIG),
  "grpc.max_receive_message_length": 4 * 1024 * 1024,
};

/** A generated client method in the shape every call uses: (request, metadata, options, callback). */
export type Unary<Req, Res> = (
  request: Req,
  metadata: Metadata,
  options: Partial<CallOptions>,
  callback: (error: ServiceError | null, response: Res) => void,
) => ClientUnaryCall;

// The unary methods of a generated client, and their request and response types (inferred from
// the last overload, which is the (request, metadata, options, callback) one).
type GrpcClient = SchedulerServiceClient | SagaServiceClient | ToolGatewayServiceClient;
// (`any` here only matches "some request and response": the callback's parameter makes the
// types invariant, so no narrower type matches every method.)
// eslint-disable-next-line @typescript-eslint/no-explicit-any
type AnyUnary = Unary<any, any>;
export type UnaryMethod<C> = {
  [K in keyof C]: C[K] extends AnyUnary ? K : never;
}[keyof C];
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type RequestOf<F> = F extends Unary<infer Req, any> ? Req : never;
// eslint-disable-next-line @typescript-eslint/no-explicit-any
export type ResponseOf<F> = F extends Unary<any, infer Res> ? Res : never;

export interface ClientOptions {
  /** API key; default AWOOOP_API_KEY. */
  key?: string;
  /** Addresses; default AWOOOP_<SERVICE>_ADDR, else AWOOOP_<SERVICE>_PORT on AWOOOP_HOST, else the `awooop up` ports. */
  scheduler?: string;
  saga?: string;
  /** The tool gateway (ToolClient): AWOOOP_GATEWAY_ADDR, ... 127.0.0.1:50054. */
  gateway?: string;
  /** Deadline of a call without its own, in seconds (default 10). */
  timeout?: number;
  /** TLS to the services; default AWOOOP_TLS, or on when a CA file is given. */
  tls?: boolean;
  /** PEM file of the CA to trust; default AWOOOP_TLS_CA_FILE. */
  caFile?: string;
  /** gRPC channel options added to (or replacing) the defaults. */
  channelOptions?: ChannelOptions;
}

/**
 * Typed clients for the scheduler, the saga service and the tool gateway, with the key and a
 * deadline on every call. (A channel connects on its first call: an unused one costs nothing.)
 */
export class Client {
  readonly scheduler: SchedulerServiceClient;
  readonly saga: SagaServiceClient;
  readonly gateway: ToolGatewayServiceClient;
  readonly addresses: Readonly<{ scheduler: string; saga: string; gateway: string }>;
  readonly timeout: number;
  /** The key as call metadata (for streaming calls, which `call` does not wrap: watchRun). */
  readonly metadata: Metadata;

  constructor(options: ClientOptions = {}) {
    this.addresses = {
      scheduler: address("scheduler", options.scheduler),
      saga: address("saga", options.saga),
      gateway: address("gateway", options.gateway),
    };
    this.timeout = options.timeout ?? DEFAULT_TIMEOUT;
    const caFile = options.caFile ?? (process.env.AWOOOP_TLS_CA_FILE || undefined);
    const tls = options.tls ?? (Boolean(caFile) || tlsFromEnv());
    const creds: ChannelCredentials = tls
      ? credentials.createSsl(caFile ? readFileSync(caFile) : null)
      : credentials.createInsecure();
    const channelOptions = { ...CHANNEL_OPTIONS, ...options.channelOptions };
    this.scheduler = new SchedulerServiceClient(channelTarget(this.addresses.scheduler), creds, channelOptions);
    this.saga = new SagaServiceClient(channelTarget(this.addresses.saga), creds, channelOptions);
    this.gateway = new ToolGatewayServiceClient(channelTarget(this.addresses.gateway), creds, channelOptions);
    this.metadata = new Metadata();
    const key = apiKey(options.key);
    if (key) this.metadata.set("authorization", `Bearer ${key}`);
  }

  /**
   * One call with a deadline (`timeout` seconds, default the client's) and the key; typed by the
   * generated client. A failure rejects with an AwooopError (LeaseLost for LEASE_LOST).
   *
   *   const { run } = await client.call(client.scheduler, "getRun", { runId });
   */
  call<C extends GrpcClient, M extends UnaryMethod<C>>(
    client: C,
    method: M,
    request: RequestOf<C[M]>,
    timeout?: number,
  ): Promise<ResponseOf<C[M]>> {
    const fn = client[method] as unknown as Unary<RequestOf<C[M]>, ResponseOf<C[M]>>;
    const deadline = new Date(Date.now() + (timeout ?? this.timeout) * 1000);
    const name = String(method).charAt(0).toUpperCase() + String(method).slice(1); // claimRuns -> ClaimRuns
    const traceparent = activeTraceparent();
    const metadata = traceparent ? this.metadata.clone() : this.metadata;
    if (traceparent) metadata.set("traceparent", traceparent);
    return new Promise((resolve, reject) => {
      fn.call(client, request, metadata, { deadline }, (err, resp) =>
        err ? reject(AwooopError.fromServiceError(err, name)) : resolve(resp),
      );
    });
  }

  /** Closes the channels (calls in flight fail CANCELLED). */
  close(): void {
    this.scheduler.close();
    this.saga.close();
    this.gateway.close();
  }
}
