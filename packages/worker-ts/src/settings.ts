// Where the services are and which key to present: the same settings, in the same order, as the
// Python SDK and the CLI read them.
import { isIP } from "node:net";

export type Service = "ingest" | "scheduler" | "saga" | "gateway";

/** The ports `awooop up` listens on. */
export const DEFAULT_PORTS: Readonly<Record<Service, number>> = {
  ingest: 50051,
  scheduler: 50052,
  saga: 50053,
  gateway: 50054,
};

type Env = Readonly<Record<string, string | undefined>>;

/** The address a local client dials for a listener bound to host (every interface: loopback). */
export function clientHost(host: string): string {
  return ({ "": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1" } as Record<string, string>)[host] ?? host;
}

/**
 * A service's address: `given`, else AWOOOP_<SERVICE>_ADDR, else AWOOOP_<SERVICE>_PORT on AWOOOP_HOST
 * (the port the service was configured to listen on), else 127.0.0.1 and the `awooop up` port.
 */
export function address(service: Service, given?: string, env: Env = process.env): string {
  if (given) return given;
  const name = service.toUpperCase();
  const addr = env[`AWOOOP_${name}_ADDR`];
  if (addr) return addr;
  const port = (env[`AWOOOP_${name}_PORT`] ?? "").trim();
  const host = clientHost((env.AWOOOP_HOST ?? "127.0.0.1").trim());
  const hostPart = host.includes(":") ? `[${host}]` : host;
  return `${hostPart}:${/^\d+$/.test(port) ? port : DEFAULT_PORTS[service]}`;
}

/** The API key: `given`, else AWOOOP_API_KEY. */
export function apiKey(given?: string, env: Env = process.env): string {
  return given ?? env.AWOOOP_API_KEY ?? "";
}

/** AWOOOP_TLS as a flag (1, true, yes, on). */
export function tlsFromEnv(env: Env = process.env): boolean {
  return ["1", "true", "yes", "on"].includes((env.AWOOOP_TLS ?? "").trim().toLowerCase());
}

/**
 * The gRPC target for an address: `host:port` and target URIs (`dns:///...`, `ipv4:...`) as given;
 * a comma-separated list of IP addresses becomes one `ipv4:` / `ipv6:` target naming every replica.
 * (A list of host names is refused: name them with one `dns:///` target instead.)
 */
export function channelTarget(addr: string): string {
  if (!addr.includes(",")) return addr.trim();
  const v4: string[] = [];
  const v6: string[] = [];
  for (const item of addr.split(",").map((a) => a.trim()).filter(Boolean)) {
    const m = /^\[?([^\]]*)\]?:(\d+)$/.exec(item);
    const family = m ? isIP(m[1]) : 0;
    if (!m || family === 0) {
      throw new Error(`address ${JSON.stringify(item)}: a list names IP:port items; use dns:///name:port for a name`);
    }
    (family === 4 ? v4 : v6).push(family === 4 ? `${m[1]}:${m[2]}` : `[${m[1]}]:${m[2]}`);
  }
  if (v4.length > 0) return `ipv4:${v4.join(",")}`; // one scheme per target: IPv4 when both are given
  return `ipv6:${v6.join(",")}`;
}

/**
 * The port a worker serves /metrics and /healthz on: AWOOOP_WORKER_HTTP_PORT (0: any free port);
 * undefined when unset (no HTTP server). Anything but a port number is refused.
 */
export function workerHttpPort(env: Env = process.env): number | undefined {
  const raw = (env.AWOOOP_WORKER_HTTP_PORT ?? "").trim();
  if (raw === "") return undefined;
  const port = /^\d+$/.test(raw) ? Number(raw) : NaN;
  if (!(port >= 0 && port <= 65535)) throw new RangeError(`AWOOOP_WORKER_HTTP_PORT: not a port number: ${JSON.stringify(raw)}`);
  return port;
}

/** The build a Worker without options.buildId declares: AWOOOP_WORKER_BUILD ("" declares none; docs/versioning.md). */
export function workerBuild(env: Env = process.env): string {
  return (env.AWOOOP_WORKER_BUILD ?? "").trim();
}

/**
 * The labels a Worker without options.labels declares: AWOOOP_WORKER_LABELS as key=value,key=value
 * ("" declares none; docs/flow-control.md, "Worker labels").
 */
export function workerLabels(env: Env = process.env): Record<string, string> {
  const out: Record<string, string> = {};
  for (const part of (env.AWOOOP_WORKER_LABELS ?? "").split(",")) {
    const item = part.trim();
    if (!item) continue;
    const eq = item.indexOf("=");
    if (eq <= 0) throw new RangeError(`AWOOOP_WORKER_LABELS: ${JSON.stringify(item)} is not key=value`);
    out[item.slice(0, eq).trim()] = item.slice(eq + 1).trim();
  }
  return out;
}
