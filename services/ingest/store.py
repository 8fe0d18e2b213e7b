"""The ingest service's SQL.

INGEST_SQL is the whole first-arrival path for any number of events in ONE statement (so one
round trip and one transaction): dedupe rows ON CONFLICT DO NOTHING, a PENDING run and a
RUN_CREATED audit row for each dedupe row actually inserted, and the existing run_id for
each event that was already there. The dedupe row and
its run are written by the same statement, so neither ever exists without the other.

Run ids are generated here (uuid4) so the statement can join the inserted dedupe rows to
their runs without a second key lookup.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

import asyncpg
from asyncpg.pgproto.pgproto import UUID

from services.common import errors
from services.common.audit import AUDIT_INSERT
from services.common.db import Conn, fetch_again_on_deadlock
from services.common.retry_policy import DEFAULTS_JSON, effective_sql, max_attempts_sql
from services.common.run_options import WAIT_DELAYED
from services.common.runs import RUN_COLUMNS
from services.common.runstate import Audit, RunStatus
from services.ingest.parsing import NewEvent, NewRun

Executor = asyncpg.Pool | Conn

# The wake-up NOTIFY is not part of these statements: it is sent after the commit
# (services/ingest/wakeup.py explains why).

# A statement's runs are created a microsecond apart in the order of its events, so the claim
# (oldest created_at first) hands out the events of one delivery (LINE sends several) and of
# one batch in the order they were sent, not in whatever order equal timestamps come back.
# Rows are inserted in key order so that two batches sharing keys lock them in the same order
# and cannot deadlock. The final join sees dedupe rows committed before the statement began;
# a row committed by a concurrent request while we waited on it shows up as run_id NULL and is
# read by FIND_SQL in a follow-up statement.
INGEST_SQL = f"""
WITH ev AS (
    -- $16 (traceparents) is NULL while tracing is off: unnest pads it with NULLs
    SELECT * FROM unnest($1::int[], $2::varchar[], $3::varchar[], $4::varchar[], $5::uuid[], $6::text[], $7::int[],
                         $11::timestamptz[], $12::int[], $13::text[], $15::text[], $16::varchar[])
        AS t(ord, project_id, channel_type, provider_event_id, run_id, input, max_attempts, not_before, priority,
             retry_policy, concurrency_keys, traceparent)
),
ins AS (
    INSERT INTO awooop_channel_event_dedupe (project_id, channel_type, provider_event_id, run_id)
    SELECT project_id, channel_type, provider_event_id, run_id FROM ev
     ORDER BY project_id, channel_type, provider_event_id
    ON CONFLICT (project_id, channel_type, provider_event_id) DO NOTHING
    RETURNING run_id
),
new_runs AS (
    INSERT INTO awooop_run_state (run_id, project_id, channel_type, provider_event_id, input, max_attempts, created_by,
                                  created_at, updated_at, not_before, wait_reason, priority, retry_policy,
                                  concurrency_keys, traceparent)
    SELECT ev.run_id, ev.project_id, ev.channel_type, ev.provider_event_id, ev.input::jsonb,
           {max_attempts_sql("ev.max_attempts", effective_sql("ev.project_id", "ev.retry_policy::jsonb", "$14"))}, $8,
           now() + ev.ord * interval '1 microsecond', now() + ev.ord * interval '1 microsecond',
           ev.not_before, CASE WHEN ev.not_before IS NOT NULL THEN '{WAIT_DELAYED}' END, ev.priority,
           ev.retry_policy::jsonb, string_to_array(ev.concurrency_keys, ' '), ev.traceparent
      FROM ev JOIN ins USING (run_id)
    RETURNING run_id, project_id, channel_type, provider_event_id
),
audited AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $9, '{Audit.RUN_CREATED}', NULL, '{RunStatus.PENDING}', NULL,
           jsonb_build_object('channel_type', channel_type, 'provider_event_id', provider_event_id)
      FROM new_runs
)
SELECT ev.ord,
       COALESCE(ins.run_id, d.run_id) AS run_id,
       ins.run_id IS NOT NULL AS created,
       extract(epoch FROM d.created_at + make_interval(secs => $10) - now())::float8 AS ttl_left
  FROM ev
  LEFT JOIN ins USING (run_id)
  LEFT JOIN awooop_channel_event_dedupe d
    ON ins.run_id IS NULL
   AND d.project_id = ev.project_id AND d.channel_type = ev.channel_type
   AND d.provider_event_id = ev.provider_event_id
"""

FIND_SQL = """
SELECT t.ord, d.run_id, extract(epoch FROM d.created_at + make_interval(secs => $5) - now())::float8 AS ttl_left
  FROM unnest($1::int[], $2::varchar[], $3::varchar[], $4::varchar[])
       AS t(ord, project_id, channel_type, provider_event_id)
  JOIN awooop_channel_event_dedupe d USING (project_id, channel_type, provider_event_id)
"""

CREATE_RUN_SQL = f"""
WITH run AS (
    INSERT INTO awooop_run_state (project_id, channel_type, input, max_attempts, created_by, not_before, wait_reason,
                                  priority, retry_policy, concurrency_keys, traceparent)
    VALUES ($1::text, 'api', $2::text::jsonb,
            {max_attempts_sql("$3::int", effective_sql("$1::text", "$9::text::jsonb", "$10"))}, $4,
            $7, CASE WHEN $7::timestamptz IS NOT NULL THEN '{WAIT_DELAYED}' END, $8, $9::text::jsonb, $11::text[], $12)
    RETURNING {RUN_COLUMNS}
),
audited AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $5, '{Audit.RUN_CREATED}', NULL, '{RunStatus.PENDING}', NULL,
           jsonb_build_object('channel_type', 'api', 'idempotency_key', $6::text)
      FROM run
)
SELECT * FROM run
"""

# The run of an API-channel event (seed 003 rules, services/ingest/api_channel.py), with its audit row;
# its flow options as CREATE_RUN_SQL's ($8 not_before, $9 priority, $10 retry policy, $11 defaults, $12 keys).
API_EVENT_RUN_SQL = f"""
WITH run AS (
    INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, input, max_attempts, created_by,
                                  traceparent, not_before, wait_reason, priority, retry_policy, concurrency_keys)
    VALUES ($1::text, 'api', $2, $3::text::jsonb,
            {max_attempts_sql("$4::int", effective_sql("$1::text", "$10::text::jsonb", "$11"))}, $5, $7,
            $8, CASE WHEN $8::timestamptz IS NOT NULL THEN '{WAIT_DELAYED}' END, $9, $10::text::jsonb, $12::text[])
    RETURNING run_id, project_id
),
audited AS (
    {AUDIT_INSERT}
    SELECT project_id, run_id, $6, '{Audit.RUN_CREATED}', NULL, '{RunStatus.PENDING}', NULL,
           jsonb_build_object('channel_type', 'api', 'provider_event_id', $2::text)
      FROM run
)
SELECT run_id FROM run"""

# Attempts at an event whose dedupe row vanished between the insert and the follow-up read
# (only retention pruning can do that); in practice the second attempt always settles it.
MAX_ATTEMPTS = 3


def new_run_ids(n: int) -> list[UUID]:
    """n random (version 4) UUIDs; one urandom call and asyncpg's C UUID type, since the
    stdlib's uuid4() is a visible cost in large batches."""
    raw = bytearray(os.urandom(16 * n))
    for i in range(0, 16 * n, 16):
        raw[i + 6] = (raw[i + 6] & 0x0F) | 0x40  # version 4
        raw[i + 8] = (raw[i + 8] & 0x3F) | 0x80  # RFC 4122 variant
    return [UUID(bytes(raw[i : i + 16])) for i in range(0, 16 * n, 16)]


@dataclass(slots=True)
class Stored:
    run_id: str
    created: bool
    # seconds the dedupe row has left before retention prunes it (duplicates only)
    ttl_left: float | None


async def ingest(
    db: Executor, events: Sequence[NewEvent], *, principal_id: str, actor: str, retention: float,
    defaults_json: str = DEFAULTS_JSON,
) -> list[Stored]:
    """Stores events whose keys are distinct; result[i] answers events[i]."""
    out: list[Stored | None] = [None] * len(events)
    pending = list(range(len(events)))
    for _ in range(MAX_ATTEMPTS):
        ev = [events[i] for i in pending]
        # keys are inserted in sorted order, so statements sharing keys should never deadlock; should
        # Postgres still report one, the statement runs again (ON CONFLICT makes it idempotent)
        rows = await fetch_again_on_deadlock(
            db,
            INGEST_SQL,
            list(range(len(ev))),
            [e.project_id for e in ev],
            [e.channel for e in ev],
            [e.provider_event_id for e in ev],
            new_run_ids(len(ev)),
            [e.input_json for e in ev],
            [e.max_attempts for e in ev],
            principal_id,
            actor,
            float(retention),
            [e.options.not_before for e in ev],
            [e.options.priority for e in ev],
            [e.options.retry_policy_json for e in ev],
            defaults_json,
            # a run's keys joined by spaces (keys are tokens without spaces): unnest takes no ragged arrays
            [" ".join(e.options.concurrency_keys) or None for e in ev],
            [e.traceparent for e in ev] if any(e.traceparent for e in ev) else None,
        )
        missing: list[int] = []
        for r in rows:
            if r["run_id"] is None:
                missing.append(r["ord"])
            else:
                out[pending[r["ord"]]] = Stored(str(r["run_id"]), r["created"], r["ttl_left"])
        if missing:
            # committed by a concurrent request after our statement's snapshot: read it now
            found = await db.fetch(
                FIND_SQL,
                missing,
                [ev[i].project_id for i in missing],
                [ev[i].channel for i in missing],
                [ev[i].provider_event_id for i in missing],
                float(retention),
            )
            for r in found:
                out[pending[r["ord"]]] = Stored(str(r["run_id"]), False, r["ttl_left"])
        pending = [i for i in pending if out[i] is None]
        if not pending:
            return out  # type: ignore[return-value]
    raise errors.store_unavailable("dedupe rows changed under the request; retry")


async def create_run(
    conn: Conn,
    run: NewRun,
    *,
    principal_id: str,
    actor: str,
    defaults_json: str = DEFAULTS_JSON,
    traceparent: str | None = None,
) -> asyncpg.Record:
    """Inserts a PENDING API run with its audit row (traceparent: the creating span's); returns the run row."""
    o = run.options
    row = await conn.fetchrow(
        CREATE_RUN_SQL,
        run.project_id,
        run.input_json,
        run.max_attempts,
        principal_id,
        actor,
        run.key,
        o.not_before,
        o.priority,
        o.retry_policy_json,
        defaults_json,
        o.keys_param,
        traceparent,
    )
    assert row is not None
    return row
