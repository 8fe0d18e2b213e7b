"""Prometheus metrics of the ingest service (children bound once: the hot path only increments)."""

from __future__ import annotations

from prometheus_client import Counter

from services.common.runs import CHANNELS

EVENTS = Counter("awooop_ingest_events_total", "Channel events ingested, by outcome", ["channel", "outcome"])
REDIS_LOOKUPS = Counter(
    "awooop_ingest_redis_lookups_total", "Dedupe lookups in Redis: hit, miss, or unavailable", ["result"]
)
MEMORY_HITS = Counter(
    "awooop_ingest_memory_hits_total", "Duplicates answered from the process's memory of recent event ids"
)
PRUNED = Counter("awooop_ingest_pruned_rows_total", "Rows removed by the retention loop", ["table"])
CREATE_RUN = Counter(
    "awooop_ingest_create_run_total",
    "CreateRun outcomes: created, replayed, conflict, forbidden, deadline",
    ["outcome"],
)

CREATED = {c: EVENTS.labels(c, "created") for c in CHANNELS}
DUPLICATE = {c: EVENTS.labels(c, "duplicate") for c in CHANNELS}
REDIS_HITS = REDIS_LOOKUPS.labels("hit")
REDIS_MISSES = REDIS_LOOKUPS.labels("miss")
REDIS_UNAVAILABLE = REDIS_LOOKUPS.labels("unavailable")
WAKEUPS = Counter("awooop_ingest_wakeups_total", "Run-ready notifications sent (one per project per flush)")
WAKEUP_FAILURES = Counter("awooop_ingest_wakeup_failures_total", "Run-ready NOTIFY statements that failed")
# per endpoint: only endpoints that exist get a series (unknown ones are 404 and not counted)
SIGNATURE_FAILURES = Counter(
    "awooop_webhook_signature_failures_total",
    "Webhook deliveries refused (401) for a missing or wrong signature, by endpoint",
    ["project_id", "channel", "endpoint"],
)
HTTP_REQUESTS = Counter(
    "awooop_http_requests_total", "HTTP requests of the ingest service, by route and status", ["route", "status"]
)
