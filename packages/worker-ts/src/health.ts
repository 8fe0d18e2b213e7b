// A worker pod's HTTP endpoint (the Worker's `httpPort`): GET /metrics (Prometheus text, the
// awooop_worker_* metrics and whatever else the registry holds) and GET /healthz, for a liveness
// probe. A worker serves no traffic, so there is nothing to be ready for: /healthz answers 200
// while run() runs, claiming or draining after SIGTERM (a probe must not kill a drain), and the
// server closes when run() returns. A handler that blocks the event loop blocks the answer too:
// that is what the probe is for.
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { register as defaultRegistry, type Registry } from "prom-client";

export interface Health {
  /** serving: claiming runs; draining: stopping after SIGTERM / stop(). */
  status: "serving" | "draining";
  worker_id: string;
  /** Leases held now. */
  held: number;
}

export class HealthServer {
  private constructor(
    private readonly server: Server,
    readonly address: string,
  ) {}

  /** Listens on port (0: any free one) and host (default every interface). */
  static async listen(
    port: number,
    host: string | undefined,
    registry: Registry | undefined,
    health: () => Health,
  ): Promise<HealthServer> {
    const server = createServer((req, res) => void answer(req, res, registry ?? defaultRegistry, health));
    await new Promise<void>((resolve, reject) => {
      server.once("error", reject);
      server.listen(port, host, () => {
        server.off("error", reject);
        resolve();
      });
    });
    const bound = server.address() as AddressInfo;
    const where = bound.family === "IPv6" ? `[${bound.address}]:${bound.port}` : `${bound.address}:${bound.port}`;
    return new HealthServer(server, where);
  }

  /** Stops listening and ends idle keep-alive connections (a scrape in flight is answered). */
  async close(): Promise<void> {
    const closed = new Promise<void>((resolve) => this.server.close(() => resolve()));
    this.server.closeIdleConnections();
    await closed;
  }
}

async function answer(req: IncomingMessage, res: ServerResponse, registry: Registry, health: () => Health): Promise<void> {
  const path = (req.url ?? "/").split("?", 1)[0];
  if (req.method !== "GET" && req.method !== "HEAD") {
    send(res, 405, "text/plain; charset=utf-8", "method not allowed: GET /metrics or /healthz\n", { allow: "GET, HEAD" });
  } else if (path === "/metrics") {
    try {
      send(res, 200, registry.contentType, await registry.metrics());
    } catch (err) {
      send(res, 500, "text/plain; charset=utf-8", `collecting the metrics failed: ${String(err)}\n`);
    }
  } else if (path === "/healthz") {
    send(res, 200, "application/json", `${JSON.stringify(health())}\n`);
  } else {
    send(res, 404, "text/plain; charset=utf-8", "not found: GET /metrics or /healthz\n");
  }
}

function send(res: ServerResponse, code: number, type: string, body: string, headers: Record<string, string> = {}): void {
  res.writeHead(code, { "content-type": type, "cache-control": "no-store", ...headers });
  res.end(body);
}
