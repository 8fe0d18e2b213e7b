// Prometheus metrics of a worker process, the Python SDK's awooop_worker_* (awooop/worker/metrics.py):
// the same names, labels and label values. They are created outside any registry and registered
// by the first Worker constructed (in prom-client's default registry unless the Worker is given
// one), so a process that only imports the package exports none of them. Serve them with the
// Worker's `httpPort` (health.ts) or from the registry in an HTTP server of your own.
import { Counter, Gauge, register as defaultRegistry, type Metric, type Registry } from "prom-client";
import { ENDED } from "./children";

export const RUNS = new Counter({
  name: "awooop_worker_runs_total",
  help: "Runs handled by this worker, by outcome",
  labelNames: ["outcome"],
  registers: [],
});
export const STEPS = new Counter({
  name: "awooop_worker_steps_total",
  help: "Journaled steps, by BeginStep action",
  labelNames: ["action"],
  registers: [],
});
export const HEARTBEATS = new Counter({
  name: "awooop_worker_heartbeats_total",
  help: "Heartbeat calls, by result",
  labelNames: ["result"],
  registers: [],
});
export const LEASES_LOST = new Counter({
  name: "awooop_worker_leases_lost_total",
  help: "Handlers stopped because their lease was lost",
  registers: [],
});
export const CHILDREN_STARTED = new Counter({
  name: "awooop_worker_children_started_total",
  help: "Child runs this worker's handlers started",
  registers: [],
});
export const CHILDREN_ENDED = new Counter({
  name: "awooop_worker_children_ended_total",
  help: "Ended child runs whose outcome a resumed parent received, by status",
  labelNames: ["status"],
  registers: [],
});
export const HELD = new Gauge({ name: "awooop_worker_leases_held", help: "Leases this worker holds now", registers: [] });

const OUTCOMES = [
  "completed",
  "failed",
  "waiting_approval",
  "parked",
  "cancelled",
  "released",
  "held",
  "lost",
  "error",
] as const;
const ACTIONS = ["execute", "skip", "retry"] as const;
export type RunOutcome = (typeof OUTCOMES)[number];
export type StepAction = (typeof ACTIONS)[number];

/** Every known label value, exported at 0 from the start so increase() alerts see the first increment. */
export const LABEL_VALUES: Readonly<Record<string, readonly string[]>> = {
  outcome: OUTCOMES,
  action: ACTIONS,
  result: ["ok", "error"],
  status: ENDED,
};

for (const outcome of OUTCOMES) RUNS.inc({ outcome }, 0);
for (const action of ACTIONS) STEPS.inc({ action }, 0);
for (const result of LABEL_VALUES.result) HEARTBEATS.inc({ result }, 0);
for (const status of ENDED) CHILDREN_ENDED.inc({ status }, 0);

const ALL: readonly Metric[] = [RUNS, STEPS, HEARTBEATS, LEASES_LOST, HELD, CHILDREN_STARTED, CHILDREN_ENDED];
const registered = new WeakSet<Registry>();

/** Registers the worker metrics in `registry` (once per registry; the Worker's constructor calls it). */
export function registerMetrics(registry: Registry = defaultRegistry): void {
  if (registered.has(registry)) return;
  for (const metric of ALL) registry.registerMetric(metric);
  registered.add(registry);
}

