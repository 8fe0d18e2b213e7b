// The worker pod's HTTP endpoint (health.ts) as a real HTTP server on a free port.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { HealthServer, type Health } from "../../src/health";
import { registerMetrics } from "../../src/metrics";

test("/metrics serves the registry, /healthz the worker's state; other paths 404, other methods 405", async () => {
  const registry = new Registry();
  registerMetrics(registry);
  let state: Health = { status: "serving", worker_id: "w-1", held: 2 };
  const server = await HealthServer.listen(0, "127.0.0.1", registry, () => state);
  const base = `http://${server.address}`;
  try {
    const metrics = await fetch(`${base}/metrics`);
    assert.equal(metrics.status, 200);
    assert.match(metrics.headers.get("content-type") ?? "", /^text\/plain/);
    assert.match(await metrics.text(), /^awooop_worker_runs_total\{outcome="completed"\} 0$/m);

    const healthz = await fetch(`${base}/healthz`);
    assert.equal(healthz.status, 200);
    assert.deepEqual(await healthz.json(), { status: "serving", worker_id: "w-1", held: 2 });
    state = { status: "draining", worker_id: "w-1", held: 1 }; // after SIGTERM: still alive, never killed mid-drain
    const draining = await fetch(`${base}/healthz?verbose=1`);
    assert.equal(draining.status, 200);
    assert.equal(((await draining.json()) as Health).status, "draining");

    const missing = await fetch(`${base}/readyz`);
    assert.equal(missing.status, 404);
    assert.match(await missing.text(), /GET \/metrics or \/healthz/);
    const posted = await fetch(`${base}/metrics`, { method: "POST" });
    assert.equal(posted.status, 405);
    assert.equal(posted.headers.get("allow"), "GET, HEAD");
    await posted.text();
  } finally {
    await server.close();
  }
  await assert.rejects(fetch(`${base}/healthz`)); // closed with run()
});

test("a port in use is refused with the listen error", async () => {
  const first = await HealthServer.listen(0, "127.0.0.1", undefined, () => ({ status: "serving", worker_id: "a", held: 0 }));
  try {
    const port = Number(first.address.split(":").pop());
    await assert.rejects(
      HealthServer.listen(port, "127.0.0.1", undefined, () => ({ status: "serving", worker_id: "b", held: 0 })),
      /EADDRINUSE/,
    );
  } finally {
    await first.close();
  }
});
