"""Prometheus metrics of the scheduler (served by the runtime's /metrics endpoint). Every known
label value is exported at 0 from start-up; projects appear as the queue sampler (queue.py)
or a claim first sees them, bounded by AWOOOP_METRICS_MAX_PROJECTS."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from prometheus_client import Counter, Gauge, Histogram

from services.common.db import Row
from services.common.observability import preset
from services.common.runstate import STATUSES, TERMINAL, RunStatus

REAPED = Counter(
    "awooop_scheduler_reaped_total",
    "Expired leases taken back by the reaper, by outcome (requeued, failed, cancelled)",
    ["outcome"],
)
CLAIMED = Counter("awooop_scheduler_claimed_total", "Runs handed to workers")
CHILDREN_STARTED = Counter(
    "awooop_scheduler_children_started_total", "Child runs started by StartChildRuns (found again: not counted)"
)
CLAIM_HANDED_BACK = Counter(
    "awooop_scheduler_claim_handed_back_total",
    "Claimed runs handed back at once because the ClaimRuns answer had no room for them (message limit)",
)
CLAIMS_ABANDONED = Counter(
    "awooop_scheduler_claims_abandoned_total",
    "ClaimRuns calls that ended (client cancel, deadline, closed connection) while waiting or claiming",
)
CLAIM_WAKEUPS = Counter(
    "awooop_scheduler_claim_wakeups_total",
    "Waiting ClaimRuns calls woken, by what woke them: a run-ready notification (one waiter each) or a "
    "woken claim passing it on (it took a full batch, or its call ended first)",
    ["by"],
)
CLAIM_UNDELIVERED = Counter(
    "awooop_scheduler_claim_undelivered_total",
    "Claimed runs handed back at once because their ClaimRuns call ended before the answer",
)
CLAIM_REPLAYS = Counter(
    "awooop_scheduler_claim_replays_total",
    "ClaimRuns calls answered with the recorded answer of an earlier call with the same claim id (a retry)",
)
TRANSITIONS = Counter(
    "awooop_scheduler_transitions_total", "Run state changes made through the API, by action", ["action"]
)
LEASE_LOST = Counter(
    "awooop_scheduler_lease_lost_total", "Worker calls refused because the lease is no longer held", ["method"]
)
APPROVALS_EXPIRED = Counter("awooop_scheduler_approvals_expired_total", "Approvals failed by expiry (E-APPROVAL-002)")
COMPENSATIONS = Counter(
    "awooop_scheduler_compensation_requests_total", "Compensation requests recorded, by trigger", ["trigger"]
)
SAGA_NUDGES = Counter(
    "awooop_scheduler_saga_nudges_total", "Compensate RPCs sent to the saga service, by outcome", ["outcome"]
)
LISTENER_UP = Gauge(
    "awooop_scheduler_listener_connected", "1 while the LISTEN connection for run wake-ups is up (else claims poll)"
)
LISTEN_UNAVAILABLE = Gauge(
    "awooop_scheduler_listen_unavailable",
    "1 while LISTEN is accepted but delivers no notifications (a transaction-mode pooler: set "
    "AWOOOP_DATABASE_DIRECT_URL); claims poll meanwhile",
)
CLAIMS_WAITING = Gauge("awooop_scheduler_claims_waiting", "Long-polling ClaimRuns calls currently waiting for work")

# --- the queue (sampled by queue.py every AWOOOP_QUEUE_METRICS_INTERVAL seconds)
RUNS = Gauge("awooop_scheduler_runs", "Unfinished runs by project and status (sampled)", ["project", "status"])
CLAIMABLE = Gauge(
    "awooop_scheduler_runs_claimable",
    "Runs a claim could take now (PENDING/RESUMED, past any retry backoff, attempts left), by project (sampled)",
    ["project"],
)
HELD = Gauge(
    "awooop_scheduler_runs_held",
    "Runs held for an operator because their worker's code did not replay their journal (HoldRun), by"
    " project (sampled)",
    ["project"],
)
DEBOUNCING = Gauge(
    "awooop_scheduler_runs_debouncing",
    "Open debounce windows: batches of debounced channel events still gathering their key's events, by"
    " project (sampled; docs/flow-control.md#debounce-and-batch)",
    ["project"],
)
RUNS_WAITING_FOR_BUILD = Gauge(
    "awooop_scheduler_runs_waiting_for_build",
    "Queued runs that only a build with no live worker may take (pinned, with journaled steps), by project"
    " (sampled; docs/versioning.md)",
    ["project"],
)
RUNS_WAITING_FOR_LABELS = Gauge(
    "awooop_scheduler_runs_waiting_for_labels",
    "Queued runs parked because no live worker has the labels they require, by project (sampled;"
    ' docs/flow-control.md, "Worker labels")',
    ["project"],
)
LABEL_SWEEP = Counter(
    "awooop_scheduler_label_sweep_runs_total",
    "Runs the label sweep parked (no live worker has their required labels) or woke (one has again)",
    ["outcome"],
)
BUILD_RUNS = Gauge(
    "awooop_scheduler_build_runs",
    "Unfinished runs on a worker build, by project, build and state (queued, held, leased, parked; sampled;"
    " only builds that are live or have runs)",
    ["project", "build", "state"],
)
BUILD_LIVE = Gauge(
    "awooop_scheduler_build_live",
    "1 while a worker build is live (a claim of it seen lately, or a lease it holds), by project and build"
    " (sampled; only builds that are live or have runs)",
    ["project", "build"],
)
OLDEST_CLAIMABLE = Gauge(
    "awooop_scheduler_oldest_claimable_age_seconds",
    "How long the oldest claimable run of the project has been claimable (0: none; sampled)",
    ["project"],
)
WAITS_OPEN = Gauge(
    "awooop_scheduler_waits_open",
    "Open durable waits by project and kind (token, sleep, event, ...; sampled)",
    ["project", "kind"],
)
OLDEST_WAIT = Gauge(
    "awooop_scheduler_oldest_open_wait_age_seconds",
    "How long the oldest open durable wait of the project has been open (0: none; sampled)",
    ["project"],
)
WAIT_OVERDUE = Gauge(
    "awooop_scheduler_wait_overdue_seconds",
    "How long past its expiry the project's most overdue open durable wait is, not yet ended by the"
    " timeout sweep (0: none; sampled)",
    ["project"],
)
SAMPLE_AGE = Gauge("awooop_scheduler_queue_sampled_timestamp_seconds", "Unix time of the last successful queue sample")
# time from claimable (queued, re-queued or backoff over) to claimed: the wait a run sees,
# without the long-poll wait of a ClaimRuns call that grpc_server_handling_seconds includes
CLAIM_WAIT = Histogram(
    "awooop_scheduler_claim_wait_seconds",
    "Time from a run becoming claimable to its claim, by project",
    ["project"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600),
)

# the statuses the queue gauges count (finished runs are counted by transitions, not sampled)
UNFINISHED = tuple(s.value for s in STATUSES if s not in TERMINAL)
OTHER_PROJECTS = "_other"  # the label of every project past the limit

preset(REAPED, ("requeued", "failed", "cancelled"))
preset(TRANSITIONS, [s.value for s in RunStatus])
preset(
    LEASE_LOST,
    (
        "Heartbeat",
        "CompleteRun",
        "CompleteRuns",
        "FailRun",
        "ReleaseRun",
        "HoldRun",
        "WaitTool",
        "ResumeTool",
        "AcknowledgeCancel",
        "RequestApproval",
    ),
)
preset(COMPENSATIONS, ("step_failed", "cancelled", "approval_rejected", "approval_expired", "manual"))
preset(SAGA_NUDGES, ("ok", "error"))


class ProjectLabels:
    """Bounded project label values: the first `limit` projects seen keep their own label, later
    ones share OTHER_PROJECTS (a label per project would let tenants grow the series count)."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.known: set[str] = set()

    def __call__(self, project: str) -> str:
        if project in self.known:
            return project
        if len(self.known) < self.limit:
            self.known.add(project)
            return project
        return OTHER_PROJECTS


PROJECTS = ProjectLabels(100)  # the runtime sets the limit from settings before serving


def count_claims(rows: Sequence[Row]) -> None:
    """Counts claimed rows (with their claim_wait column, seconds) in CLAIMED and CLAIM_WAIT."""
    if not rows:
        return
    CLAIMED.inc(len(rows))
    # the labelled child looked up once per project of the call, not per run (a lock and a
    # dict lookup each): a claim's rows mostly share one project
    children: dict[str, Any] = {}
    for r in rows:
        project = r["project_id"]
        child = children.get(project)
        if child is None:
            child = children[project] = CLAIM_WAIT.labels(PROJECTS(project))
        child.observe(max(0.0, r["claim_wait"] or 0.0))
