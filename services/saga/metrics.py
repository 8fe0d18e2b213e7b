"""Prometheus metrics of the saga service."""

from __future__ import annotations

from enum import StrEnum

from prometheus_client import Counter, Gauge, Histogram

from services.common.observability import preset
from services.common.sagastate import SagaStatus


class UndoOutcome(StrEnum):
    """awooop_saga_compensation_steps_total{outcome}: what became of one step's undo."""

    COMPENSATED = "compensated"  # the gateway ran it
    REPLAYED = "replayed"  # the gateway answered the first run's result (the same idempotency key)
    FAILED = "failed"  # the gateway answered an error: the step is compensation_failed


# awooop_saga_compensation_runs_total{status}: a request ended with nothing to undo
SKIPPED = "skipped"

STEP_WRITES = Counter("awooop_saga_step_writes_total", "Journal writes by operation and outcome", ["op", "outcome"])
COMPENSATIONS = Counter("awooop_saga_compensation_steps_total", "Compensation commands run, by outcome", ["outcome"])
COMPENSATION_RUNS = Counter(
    "awooop_saga_compensation_runs_total", "Compensation requests driven to an end, by final saga status", ["status"]
)
GATEWAY_LATENCY = Histogram(
    "awooop_saga_gateway_call_seconds",
    "ToolGateway.ExecuteTool latency seen by the saga",
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
)
# compensation calls the tool gateway answered UNAUTHENTICATED: AWOOOP_INTERNAL_API_KEY refused
GATEWAY_UNAUTHENTICATED = Counter(
    "awooop_saga_gateway_unauthenticated_total",
    "Compensation calls the tool gateway refused UNAUTHENTICATED (AWOOOP_INTERNAL_API_KEY missing or not accepted)",
)
GATEWAY_AUTH_PROBES = Counter(
    "awooop_saga_gateway_auth_probes_total",
    "Checks of AWOOOP_INTERNAL_API_KEY against the tool gateway, by answer",
    ["outcome"],
)
GATEWAY_KEY_REFUSED = Gauge(
    "awooop_saga_gateway_key_refused",
    "1 while the saga has no key the tool gateway accepts: compensation stopped, the saga NOT_SERVING",
)
ALERTS = Counter("awooop_saga_alerts_total", "Escalation deliveries by channel and outcome", ["channel", "outcome"])

# every known label value at 0 from start-up (an alert on increase() fires on the first failure)
for _op, _outcomes in (
    ("begin", ("execute", "skip", "retry")),
    ("complete", ("ok",)),
    ("record", ("ok", "already_completed")),
    ("fail", ("ok",)),
):
    preset(STEP_WRITES, (_op,), _outcomes)
preset(COMPENSATIONS, tuple(UndoOutcome))
preset(COMPENSATION_RUNS, (SagaStatus.COMPENSATED, SagaStatus.COMPENSATION_FAILED, SKIPPED))
preset(GATEWAY_AUTH_PROBES, ("accepted", "refused", "no_answer"))
preset(ALERTS, ("redis", "telegram"), ("ok", "error"))
