"""Prometheus metrics of the ingest service (children bound once: the hot path only increments;
every known label value exported at 0 from start-up)."""

from __future__ import annotations

from prometheus_client import Counter

from services.common.observability import preset
from services.common.runs import CHANNELS

EVENTS = Counter("awooop_ingest_events_total", "Channel events ingested, by outcome", ["channel", "outcome"])
DEDUPE = Counter(
    "awooop_ingest_dedupe_answers_total",
    "Channel events by the path that answered them (memory, redis, postgres) and the answer (new, duplicate)",
    ["channel", "path", "answer"],
)
REDIS_LOOKUPS = Counter(
    "awooop_ingest_redis_lookups_total",
    "Dedupe lookups in Redis: hit, miss, unavailable, or skipped (duplicates too rare for a lookup to pay)",
    ["result"],
)
PRUNED = Counter("awooop_ingest_pruned_rows_total", "Rows removed by the retention loop", ["table"])
CREATE_RUN = Counter(
    "awooop_ingest_create_run_total",
    "CreateRun outcomes: created, replayed, conflict, forbidden, deadline",
    ["outcome"],
)
WAKEUPS = Counter("awooop_ingest_wakeups_total", "Run-ready notifications sent (one per project per flush)")
WAKEUP_FAILURES = Counter("awooop_ingest_wakeup_failures_total", "Run-ready NOTIFY statements that failed")

CREATED = {c: EVENTS.labels(c, "created") for c in CHANNELS}
DUPLICATE = {c: EVENTS.labels(c, "duplicate") for c in CHANNELS}
# (channel, path, duplicate?) -> child; only Postgres creates, memory and Redis only know duplicates
DEDUPE_ANSWERS = {
    (c, path, dup): DEDUPE.labels(c, path, "duplicate" if dup else "new")
    for c in CHANNELS
    for path, dup in (("memory", True), ("redis", True), ("postgres", True), ("postgres", False))
}
REDIS_HITS = REDIS_LOOKUPS.labels("hit")
REDIS_MISSES = REDIS_LOOKUPS.labels("miss")
REDIS_UNAVAILABLE = REDIS_LOOKUPS.labels("unavailable")
REDIS_SKIPPED = REDIS_LOOKUPS.labels("skipped")
# per endpoint: only endpoints that exist get a series (unknown ones are 404 and not counted)
SIGNATURE_FAILURES = Counter(
    "awooop_webhook_signature_failures_total",
    "Webhook deliveries refused (401) for a missing or wrong signature, by endpoint",
    ["project", "channel", "endpoint"],  # `project`, as every per-project metric labels it
)
HTTP_REQUESTS = Counter(
    "awooop_http_requests_total", "HTTP requests of the ingest service, by route and status", ["route", "status"]
)
DEBOUNCE = Counter(
    "awooop_ingest_debounced_events_total",
    "Channel events a debounce rule batched: the first of a batch (opened) or a later one (joined)",
    ["channel", "batch"],
)
# (channel, opened?) -> child
DEBOUNCED = {
    (c, opened): DEBOUNCE.labels(c, "opened" if opened else "joined") for c in CHANNELS for opened in (True, False)
}
preset(PRUNED, ("awooop_channel_event_dedupe", "awooop_idempotency_key"))
preset(CREATE_RUN, ("created", "replayed", "conflict", "forbidden", "deadline"))
