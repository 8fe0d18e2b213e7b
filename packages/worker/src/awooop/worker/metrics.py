"""Prometheus metrics of a worker process.

They are created outside any registry and registered in the default one by the first Worker
constructed (`register`): a process that only imports the SDK (the `awooop` command line, a
server process) exports none of them. Expose them with `prometheus_client.start_http_server`.

prometheus-client is the `metrics` extra of awooop-worker: without it the same names count
nothing (_Unkept), so the SDK's code has one path either way.
"""

from __future__ import annotations

import threading
from typing import Any

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge
except ImportError:  # awooop-worker without its `metrics` extra
    REGISTRY = None  # type: ignore[assignment]

    class _Unkept:
        """A counter or gauge that keeps nothing: labels, inc and set accept and drop."""

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def labels(self, *values: str) -> _Unkept:
            return self

        def inc(self, amount: float = 1) -> None:
            pass

        def set(self, value: float) -> None:
            pass

    Counter = Gauge = _Unkept  # type: ignore[assignment,misc]

RUNS = Counter("awooop_worker_runs_total", "Runs handled by this worker, by outcome", ["outcome"], registry=None)
STEPS = Counter("awooop_worker_steps_total", "Journaled steps, by BeginStep action", ["action"], registry=None)
HEARTBEATS = Counter("awooop_worker_heartbeats_total", "Heartbeat calls, by result", ["result"], registry=None)
LEASES_LOST = Counter("awooop_worker_leases_lost_total", "Handlers stopped because their lease was lost", registry=None)
CHILDREN_STARTED = Counter(
    "awooop_worker_children_started_total", "Child runs this worker's handlers started", registry=None
)
CHILDREN_ENDED = Counter(
    "awooop_worker_children_ended_total",
    "Ended child runs whose outcome a resumed parent received, by status",
    ["status"],
    registry=None,
)
HELD = Gauge("awooop_worker_leases_held", "Leases this worker holds now", registry=None)

# every known label value at 0 from the start, so increase() alerts see the first increment
for _o in ("completed", "failed", "waiting_approval", "cancelled", "released", "held", "lost", "error"):
    RUNS.labels(_o)
for _a in ("execute", "skip", "retry"):
    STEPS.labels(_a)
for _r in ("ok", "error"):
    HEARTBEATS.labels(_r)
for _s in ("completed", "failed", "cancelled"):
    CHILDREN_ENDED.labels(_s)

_registered: set[int] = set()
_lock = threading.Lock()


def register(registry: CollectorRegistry | None = REGISTRY) -> None:
    """Registers the worker metrics in registry (once per registry; Worker() calls it)."""
    if registry is None:  # no prometheus-client: nothing to register in
        return
    with _lock:
        if id(registry) in _registered:
            return
        for m in (RUNS, STEPS, HEARTBEATS, LEASES_LOST, HELD, CHILDREN_STARTED, CHILDREN_ENDED):
            registry.register(m)
        _registered.add(id(registry))
