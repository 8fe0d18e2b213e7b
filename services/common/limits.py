"""The input limits, each defined once: most are the width of the store column (or the CHECK)
the value ends up in, so an accepted value can always be stored. The README's error table and
services/common/validate.py refer to them by these names."""

from __future__ import annotations

MAX_ID = 128  # caller-chosen ids: worker, step, tool and claim ids (VARCHAR(128) columns)
MAX_TEXT = 4096  # reasons, summaries, error texts
MAX_IDEMPOTENCY_KEY = 256  # awooop_idempotency_key.key, the API channel's Idempotency-Key
MAX_PROVIDER_EVENT_ID = 256  # awooop_channel_event_dedupe.provider_event_id, awooop_run_state's
MAX_CONCURRENCY_KEY = 128  # awooop_run_state.concurrency_keys VARCHAR(128)[], awooop_concurrency_limit.key
MAX_SCHEDULE_NAME = 128  # awooop_schedule.name
MAX_CRON = 256  # awooop_schedule.cron
MAX_TIME_ZONE = 64  # awooop_schedule.time_zone; IANA names are at most about 30 characters
MAX_ERROR_CODE = 64  # awooop_run_state.error_code
MAX_ATTEMPTS_LIMIT = 100  # CHECK (max_attempts BETWEEN 1 AND 100)
MAX_URL = 2048  # URLs a caller hands a service (a parked tool call's callback URL)
MAX_EVENT_KIND = 128  # awooop_run_event.kind VARCHAR(128), a progress event's kind
MAX_EMIT_KEY = 128  # awooop_run_event.emit_key VARCHAR(128)
# child runs (issue 28): the hard caps the settings AWOOOP_MAX_CHILD_DEPTH and
# AWOOOP_MAX_CHILDREN_PER_RUN may not exceed, and the children one StartChildRuns call may start
MAX_CHILD_DEPTH = 32  # awooop_run_state.child_depth SMALLINT; deeper trees are a runaway recursion
MAX_CHILDREN_PER_RUN = 10000  # a run's children over its life (the fan-out limit)
MAX_CHILDREN_PER_CALL = 1000  # one StartChildRuns: one statement, and its answer fits one message
