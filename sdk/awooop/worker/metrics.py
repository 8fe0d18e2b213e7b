"""Prometheus metrics of a worker process (exposed only if the application serves the registry)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

RUNS = Counter("awooop_worker_runs_total", "Runs handled by this worker, by outcome", ["outcome"])
STEPS = Counter("awooop_worker_steps_total", "Journaled steps, by BeginStep action", ["action"])
HEARTBEATS = Counter("awooop_worker_heartbeats_total", "Heartbeat calls, by result", ["result"])
LEASES_LOST = Counter("awooop_worker_leases_lost_total", "Handlers stopped because their lease was lost")
HELD = Gauge("awooop_worker_leases_held", "Leases this worker holds now")
