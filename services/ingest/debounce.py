"""Debounce and batch at ingest (issue 46; docs/flow-control.md#debounce-and-batch).

A project's debounce rule for a channel (set through the scheduler's flow RPCs) names a key
expression (services/common/debounce_key.py), a quiet window, a max wait and a mode. The channel's
events with a key go here instead of StoreEvents: the events of one key arriving within the window
become ONE run, due when the key has been quiet for the window, and at the latest the max wait
after the batch's first event. Each event keeps its own dedupe row, which names the batch's run, so
a provider's retry of an event already in a batch is a duplicate answered with that run.

The batch is the run itself, created by the batch's first event: PENDING with wait_reason
'debounce' and not_before the window's end, which the claim passes over until then. Every later
event of the key, while the run is still that (unclaimed, its window not over), grows its input and
pushes not_before out. All of a flush's debounced events are stored by one transaction
(debounce.sql, in this order: lock the keys' window rows, lock their open batches, plan which
batch each event goes to (plan: a full batch, MAX_BATCH_EVENTS or the payload limit, is closed and
the next opened), record the events' dedupe rows, create, grow or close the batches), so a crash
before its commit stores none of them and the provider's retry stores them then, and after it every
acknowledged event is in its run's input; nothing lives only in a process. The claim starts the
run once its not_before has passed.

The run's input, defined here once (batch_input):

    {"events": [<each event's own input, oldest first>],   # mode "last": only the latest
     "debounce": {"key": <the key>, "mode": "all" | "last", "count": <events in the batch>}}
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any
from uuid import UUID

import asyncpg

from services.common import debounce_key, errors
from services.common.db import again_on_deadlock
from services.ingest import debounce_sql, metrics, store, store_sql
from services.ingest.parsing import NewEvent

MODES = ("all", "last")
# A batch that took this many events is due at once (its window closes; the key's next event opens
# the next batch): every event rewrites the run's input, so a storm inside a long max wait would
# otherwise cost each event more than the one before.
MAX_BATCH_EVENTS = 1000
ENVELOPE_BYTES = 96  # batch_input's JSON around the events and the key, at most
Pair = tuple[str, str]  # (project, channel)
Key = tuple[str, str, str]  # (project, channel, key)


@dataclass(frozen=True, slots=True)
class Rule:
    expression: str
    path: tuple[str, ...]
    window: float  # seconds of quiet that end a batch
    max_wait: float  # seconds from a batch's first event to its start, at most
    mode: str  # "all" | "last"


@dataclass(frozen=True, slots=True)
class Debounced:
    """An event a rule batches: its key and the rule."""

    event: NewEvent
    key: str
    rule: Rule


def batch_input(key: str, mode: str, prior: dict[str, Any] | None, inputs: Sequence[Any]) -> dict[str, Any]:
    """The input of a batch run: prior (its input so far, None for a new batch) with inputs added."""
    events = [*(prior["events"] if prior else []), *inputs]
    count = (prior["debounce"]["count"] if prior else 0) + len(inputs)
    return {"events": events[-1:] if mode == "last" else events, "debounce": {"key": key, "mode": mode, "count": count}}


class Rules:
    """Each (project, channel)'s rule as this process last read it, trusted for ttl seconds."""

    def __init__(self, pool: asyncpg.Pool, ttl: float) -> None:
        self.pool = pool
        self.ttl = ttl
        self._known: dict[Pair, tuple[Rule | None, float]] = {}

    async def of(self, pairs: Iterable[Pair]) -> dict[Pair, Rule | None]:
        now = time.monotonic()
        wanted = set(pairs)
        stale = [p for p in wanted if p not in self._known or self._known[p][1] <= now]
        if stale:
            rows = await debounce_sql.read_debounce_rules(
                self.pool, project_ids=[p for p, _ in stale], channels=[c for _, c in stale]
            )
            found: dict[Pair, Rule | None] = dict.fromkeys(stale)
            for r in rows:
                path = debounce_key.parse(r["key_expression"])
                if path is not None and r["mode"] in MODES:
                    found[r["project_id"], r["channel_type"]] = Rule(
                        r["key_expression"], path, r["window_secs"], r["max_wait_secs"], r["mode"]
                    )
            for p, rule in found.items():
                self._known[p] = (rule, now + self.ttl)
        return {p: self._known[p][0] for p in wanted}

    async def split(self, events: Sequence[NewEvent]) -> list[Debounced | None]:
        """Per event: how a rule batches it, or None (no rule for its channel, or no key in it)."""
        rules = await self.of((e.project_id, e.channel) for e in events)
        out: list[Debounced | None] = []
        for e in events:
            rule = rules[e.project_id, e.channel]
            key = debounce_key.evaluate(rule.path, json.loads(e.input_json)) if rule else None
            out.append(Debounced(e, key, rule) if rule and key is not None else None)
        return out


async def ingest(
    pool: asyncpg.Pool,
    items: Sequence[Debounced],
    *,
    principal_id: str,
    actor: str,
    retention: float,
    defaults_json: str,
    max_bytes: int,
) -> list[store.Stored]:
    """Stores debounced events with distinct provider event ids; result[i] answers items[i]
    (created: a first arrival, whose run is its batch's). max_bytes: a batch input's bound."""

    async def once() -> tuple[list[store.Stored], list[tuple[str, bool]]]:
        async with pool.acquire() as conn, conn.transaction():
            return await _store(conn, items, principal_id, actor, retention, defaults_json, max_bytes)

    out, batched = await again_on_deadlock(once)
    for channel, opened in batched:  # counted once committed
        metrics.DEBOUNCED[channel, opened].inc()
    return out


async def _store(
    conn: Any,
    items: Sequence[Debounced],
    principal_id: str,
    actor: str,
    retention: float,
    defaults_json: str,
    max_bytes: int,
) -> tuple[list[store.Stored], list[tuple[str, bool]]]:
    """The transaction's statements, in their order (debounce.sql says why that order); with each
    new event's (channel, whether it opened its batch)."""
    locked = await lock_batches(conn, items)
    opened = list(locked.values())  # (plan replaces a full one in the dict: it is closed all the same)
    planned = plan(items, locked, max_bytes)
    ev = [d.event for d in items]
    recorded = await debounce_sql.record_debounced_events(
        conn,
        project_ids=[e.project_id for e in ev],
        channels=[e.channel for e in ev],
        provider_event_ids=[e.provider_event_id for e in ev],
        run_ids=[b.run_id for b in planned],
    )
    new = {(r["project_id"], r["channel_type"], r["provider_event_id"]) for r in recorded}
    out: list[store.Stored | None] = [None] * len(items)
    for i, (d, b) in enumerate(zip(items, planned, strict=True)):
        if (d.event.project_id, d.event.channel, d.event.provider_event_id) in new:
            out[i] = store.Stored(str(b.run_id), True, None)
            b.events.append(d)
    await _answer_duplicates(conn, ev, [i for i, x in enumerate(out) if x is None], out, retention)
    batched = await write_batches(conn, touched(opened, planned), principal_id, actor, defaults_json)
    return out, batched  # type: ignore[return-value]  # every slot is filled: recorded now, or before


def _key(d: Debounced) -> Key:
    return (d.event.project_id, d.event.channel, d.key)


@dataclass(slots=True)
class Batch:
    """A batch a flush touches: an open one (opened_at, its input so far) or one it opens."""

    run_id: UUID
    key: Key
    opened_at: datetime | None = None  # None: opened by this flush
    prior: dict[str, Any] | None = None  # an open batch's input so far
    size: int = 0  # bytes of its input, as planned
    count: int = 0  # events in it, as planned
    full: bool = False  # due at once: it takes no more events
    events: list[Debounced] = field(default_factory=list)  # the new events it takes (after dedupe)


async def lock_batches(conn: Any, items: Sequence[Debounced]) -> dict[Key, Batch]:
    """The first two statements of the transaction: each key's open batch, locked, or a new one."""
    keys = sorted({_key(d) for d in items})
    windows = await debounce_sql.lock_debounce_windows(
        conn,
        ords=list(range(len(keys))),
        project_ids=[k[0] for k in keys],
        channels=[k[1] for k in keys],
        keys=[k[2] for k in keys],
    )
    last = {keys[w["ord"]]: (w["run_id"], w["opened_at"]) for w in windows}
    rows = await debounce_sql.lock_open_batches(conn, run_ids=[r for r, _ in last.values() if r is not None])
    open_inputs = {r["run_id"]: r["input"] for r in rows}
    batches: dict[Key, Batch] = {}
    for k, new_id in zip(keys, store.new_run_ids(len(keys)), strict=True):
        run_id, opened_at = last[k]
        text = open_inputs.get(run_id) if run_id is not None else None
        if run_id is not None and text is not None:
            prior = json.loads(text)
            batches[k] = Batch(run_id, k, opened_at, prior, len(text.encode()), prior["debounce"]["count"])
        else:
            batches[k] = Batch(new_id, k, size=ENVELOPE_BYTES + len(k[2].encode()))
    return batches


def plan(items: Sequence[Debounced], batches: dict[Key, Batch], max_bytes: int) -> list[Batch]:
    """The batch each item goes to, in order: its key's batch while that can take it, else a new
    one (the full one is then due at once). A batch takes at most MAX_BATCH_EVENTS events and
    keeps its input within max_bytes (AWOOOP_MAX_PAYLOAD_BYTES: a run must stay deliverable),
    unless one event alone is that large. Planned before the dedupe rows tell which events are
    new, so a duplicate counts too: a batch may close a little early, never too late."""
    out = []
    for d in items:
        b = batches[_key(d)]
        size = len(d.event.input_json.encode()) + 1
        empty = ENVELOPE_BYTES + len(b.key[2].encode())  # a batch's input without events
        if d.rule.mode == "last":
            b.size = empty  # it keeps the latest event only
        if b.full or (b.count and b.size + size > max_bytes):
            b.full = True
            b = batches[b.key] = Batch(store.new_run_ids(1)[0], b.key, size=empty)
        b.size += size
        b.count += 1
        b.full = b.count >= MAX_BATCH_EVENTS
        out.append(b)
    return out


async def _answer_duplicates(
    conn: Any, ev: list[NewEvent], dups: list[int], out: list[store.Stored | None], retention: float
) -> None:
    """Fills out[i] (i in dups: events whose dedupe row was there) with the run their row names."""
    if not dups:
        return
    found = await store_sql.find_stored_events(
        conn,
        ords=dups,
        project_ids=[ev[i].project_id for i in dups],
        channels=[ev[i].channel for i in dups],
        provider_event_ids=[ev[i].provider_event_id for i in dups],
        retention=float(retention),
    )
    for f in found:
        out[f["ord"]] = store.Stored(str(f["run_id"]), False, f["ttl_left"])
    if len(found) < len(dups):  # a row pruned between the insert and the read: the retry settles it
        raise errors.store_unavailable("dedupe rows changed under the request; retry")


def touched(locked: Sequence[Batch], planned: Sequence[Batch]) -> list[Batch]:
    """The batches a flush touched, each once: those it locked (open or new) and those it opened."""
    return list({id(b): b for b in [*locked, *planned]}.values())


async def write_batches(
    conn: Any, batches: Sequence[Batch], principal_id: str, actor: str, defaults_json: str
) -> list[tuple[str, bool]]:
    """Opens or grows each batch new events joined (their `events`, in arrival order), and closes
    each open one that is full: one statement. Returns each new event's (channel, whether it opened
    its batch)."""
    ws = [b for b in batches if b.events or (b.full and b.opened_at is not None)]
    if not ws:
        return []
    batched = [(d.event.channel, b.opened_at is None and n == 0) for b in ws for n, d in enumerate(b.events)]
    inputs = []
    for b in ws:
        rule = b.events[-1].rule if b.events else None
        mode = rule.mode if rule else str(b.prior["debounce"]["mode"] if b.prior else "all")
        added = [json.loads(d.event.input_json) for d in b.events]
        inputs.append(json.dumps(batch_input(b.key[2], mode, b.prior, added)))
    # a new batch's run takes its first event's options; an open batch's options are its own
    firsts = [b.events[0].event if b.events else None for b in ws]
    await debounce_sql.write_batches(
        conn,
        ords=list(range(len(ws))),
        run_ids=[b.run_id for b in ws],
        opened_ats=[b.opened_at for b in ws],
        project_ids=[b.key[0] for b in ws],
        channels=[b.key[1] for b in ws],
        keys=[b.key[2] for b in ws],
        provider_event_ids=[e.provider_event_id if e else None for e in firsts],
        inputs=inputs,
        window_secs=[b.events[-1].rule.window if b.events else 0.0 for b in ws],
        max_wait_secs=[b.events[-1].rule.max_wait if b.events else 0.0 for b in ws],
        fulls=[b.full for b in ws],
        max_attempts=[e.max_attempts if e else 0 for e in firsts],
        priorities=[e.options.priority if e else 0 for e in firsts],
        retry_policies=[e.options.retry_policy_json if e else None for e in firsts],
        concurrency_keys=[" ".join(e.options.concurrency_keys) or None if e else None for e in firsts],
        traceparents=[e.traceparent if e else None for e in firsts],
        auto_upgrades=[e.options.auto_upgrade if e else None for e in firsts],
        required_labels=[e.options.required_labels_json if e else None for e in firsts],
        preferred_labels=[e.options.preferred_labels_json if e else None for e in firsts],
        policy_defaults=defaults_json,
        principal_id=principal_id,
        actor=actor,
    )
    return batched
