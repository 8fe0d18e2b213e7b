"""The ingest service's store side: the first-arrival statement for channel events
(StoreEvents, store.sql) and the run of a CreateRun.

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
from services.common.db import Conn, again_on_deadlock
from services.common.retry_policy import DEFAULTS_JSON
from services.ingest import store_sql
from services.ingest.parsing import NewEvent, NewRun

Executor = asyncpg.Pool | Conn

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


def joined_keys(ev: Sequence[NewEvent]) -> list[str | None]:
    """Each event's concurrency keys as one text, joined by spaces (keys are tokens without
    spaces), since unnest takes no ragged arrays; the batch statements split them back."""
    return [" ".join(e.options.concurrency_keys) or None for e in ev]


def traceparents(ev: Sequence[NewEvent]) -> list[str | None] | None:
    """Each event's traceparent, or None when no event of the batch has one."""
    return [e.traceparent for e in ev] if any(e.traceparent for e in ev) else None


async def ingest(
    db: Executor,
    events: Sequence[NewEvent],
    *,
    principal_id: str,
    actor: str,
    retention: float,
    defaults_json: str = DEFAULTS_JSON,
) -> list[Stored]:
    """Stores events whose keys are distinct; result[i] answers events[i]."""
    out: list[Stored | None] = [None] * len(events)
    pending = list(range(len(events)))
    for _ in range(MAX_ATTEMPTS):
        ev = [events[i] for i in pending]
        rows = await _store_events(
            db, ev, principal_id=principal_id, actor=actor, retention=retention, defaults_json=defaults_json
        )
        missing: list[int] = []
        for r in rows:
            if r["run_id"] is None:
                missing.append(r["ord"])
            else:
                out[pending[r["ord"]]] = Stored(str(r["run_id"]), r["created"], r["ttl_left"])
        if missing:
            for found in await _stored_meanwhile(db, ev, missing, retention):
                out[pending[found["ord"]]] = Stored(str(found["run_id"]), False, found["ttl_left"])
        pending = [i for i in pending if out[i] is None]
        if not pending:
            return out  # type: ignore[return-value]
    raise errors.store_unavailable("dedupe rows changed under the request; retry")


async def _store_events(
    db: Executor, ev: list[NewEvent], *, principal_id: str, actor: str, retention: float, defaults_json: str
) -> list[store_sql.StoreEventsRow]:
    """StoreEvents of ev (its "ord": the index in ev). Keys are inserted in sorted order, so
    statements sharing keys should never deadlock; should Postgres still report one, the
    statement runs again (ON CONFLICT makes it idempotent)."""
    run_ids = new_run_ids(len(ev))
    return await again_on_deadlock(
        lambda: store_sql.store_events(
            db,
            ords=list(range(len(ev))),
            project_ids=[e.project_id for e in ev],
            channels=[e.channel for e in ev],
            provider_event_ids=[e.provider_event_id for e in ev],
            run_ids=run_ids,
            inputs=[e.input_json for e in ev],
            max_attempts=[e.max_attempts for e in ev],
            not_befores=[e.options.not_before for e in ev],
            priorities=[e.options.priority for e in ev],
            retry_policies=[e.options.retry_policy_json for e in ev],
            concurrency_keys=joined_keys(ev),
            traceparents=traceparents(ev),
            auto_upgrades=[e.options.auto_upgrade for e in ev],
            required_labels=[e.options.required_labels_json for e in ev],
            preferred_labels=[e.options.preferred_labels_json for e in ev],
            policy_defaults=defaults_json,
            principal_id=principal_id,
            actor=actor,
            retention=float(retention),
        )
    )


async def _stored_meanwhile(
    db: Executor, ev: list[NewEvent], missing: list[int], retention: float
) -> list[store_sql.FindStoredEventsRow]:
    """The dedupe rows of ev[i] (i in missing, its "ord") that a concurrent request committed after
    the statement's snapshot: read now."""
    return await store_sql.find_stored_events(
        db,
        ords=missing,
        project_ids=[ev[i].project_id for i in missing],
        channels=[ev[i].channel for i in missing],
        provider_event_ids=[ev[i].provider_event_id for i in missing],
        retention=float(retention),
    )


async def create_run(
    conn: Conn,
    run: NewRun,
    *,
    principal_id: str,
    actor: str,
    defaults_json: str = DEFAULTS_JSON,
    traceparent: str | None = None,
) -> store_sql.CreateRunRow:
    """Inserts a PENDING API run with its audit row (traceparent: the creating span's); returns the run row."""
    o = run.options
    row = await store_sql.create_run(
        conn,
        project_id=run.project_id,
        input=run.input_json,
        max_attempts=run.max_attempts,
        principal_id=principal_id,
        actor=actor,
        idempotency_key=run.key,
        not_before=o.not_before,
        priority=o.priority,
        retry_policy=o.retry_policy_json,
        policy_defaults=defaults_json,
        concurrency_keys=o.keys_param,
        traceparent=traceparent,
        auto_upgrade=o.auto_upgrade,
        required_labels=o.required_labels_json,
        preferred_labels=o.preferred_labels_json,
    )
    assert row is not None
    return row
