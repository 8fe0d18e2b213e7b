"""Prometheus metrics of the scheduler (served by the runtime's /metrics endpoint)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

REAPED = Counter(
    "awooop_scheduler_reaped_total",
    "Expired leases taken back by the reaper, by outcome (requeued, failed, cancelled)",
    ["outcome"],
)
CLAIMED = Counter("awooop_scheduler_claimed_total", "Runs handed to workers")
CLAIM_HANDED_BACK = Counter(
    "awooop_scheduler_claim_handed_back_total",
    "Claimed runs handed back at once because the ClaimRuns answer had no room for them (message limit)",
)
CLAIMS_ABANDONED = Counter(
    "awooop_scheduler_claims_abandoned_total",
    "ClaimRuns calls that ended (client cancel, deadline, closed connection) while waiting or claiming",
)
CLAIM_UNDELIVERED = Counter(
    "awooop_scheduler_claim_undelivered_total",
    "Claimed runs handed back at once because their ClaimRuns call ended before the answer",
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
