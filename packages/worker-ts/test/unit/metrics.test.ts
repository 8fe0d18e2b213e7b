// The Prometheus metrics: the Python SDK's awooop_worker_* names, labels and label values, every
// known label value at 0 once registered.
import assert from "node:assert/strict";
import { test } from "node:test";
import { Registry } from "prom-client";
import { LABEL_VALUES, registerMetrics } from "../../src/index";

// the Python SDK's (awooop/worker/metrics.py): name -> its label, "" for none
const PYTHON_SDK: Record<string, string> = {
  awooop_worker_runs_total: "outcome",
  awooop_worker_steps_total: "action",
  awooop_worker_heartbeats_total: "result",
  awooop_worker_leases_lost_total: "",
  awooop_worker_leases_held: "",
  awooop_worker_children_started_total: "",
  awooop_worker_children_ended_total: "status",
};

test("a registry gets the worker metrics once, each known label value exported at 0", async () => {
  const registry = new Registry();
  registerMetrics(registry);
  registerMetrics(registry); // a second Worker on the same registry: no duplicate registration
  const metrics = await registry.getMetricsAsJSON();
  const byName = new Map(metrics.map((m) => [m.name, m]));
  assert.deepEqual([...byName.keys()].sort(), Object.keys(PYTHON_SDK).sort());
  for (const [name, label] of Object.entries(PYTHON_SDK)) {
    if (label === "") continue;
    const values = (byName.get(name)?.values ?? []).map((v) => String(v.labels[label]));
    for (const known of LABEL_VALUES[label]) assert.ok(values.includes(known), `${name}{${label}="${known}"}`);
  }
  const text = await registry.metrics();
  assert.match(text, /^awooop_worker_runs_total\{outcome="waiting_approval"\} 0$/m);
  assert.match(text, /^awooop_worker_heartbeats_total\{result="error"\} 0$/m);
  assert.match(text, /^# TYPE awooop_worker_leases_held gauge$/m);
});

test("the label values are the Python SDK's", () => {
  assert.deepEqual([...LABEL_VALUES.outcome].sort(), [
    "cancelled",
    "completed",
    "error",
    "failed",
    "held",
    "lost",
    "parked",
    "released",
    "waiting_approval",
  ]);
  assert.deepEqual([...LABEL_VALUES.action], ["execute", "skip", "retry"]);
  assert.deepEqual([...LABEL_VALUES.result], ["ok", "error"]);
  assert.deepEqual([...LABEL_VALUES.status], ["completed", "failed", "cancelled"]);
});
