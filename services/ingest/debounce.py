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
(debounce.sql, in this order: lock the keys' window rows, lock their open batches, record the
events' dedupe rows, create or grow the batches), so a crash before its commit stores none of them
and the provider's retry stores them then, and after it every acknowledged event is in its run's
input; nothing lives only in a process. The claim starts the run once its not_before has passed.

The run's input, defined here once (batch_input):

    {"events": [<each event's own input, oldest first>],   # mode "last": only the latest
     "debounce": {"key": <the key>, "mode": "all" | "last", "count": <events in the batch>}}
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
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
) -> list[store.Stored]:
    """Stores debounced events with distinct provider event ids; result[i] answers items[i]
    (created: a first arrival, whose run is its batch's)."""

    async def once() -> tuple[list[store.Stored], list[tuple[str, bool]]]:
        async with pool.acquire() as conn, conn.transaction():
            return await _store(conn, items, principal_id, actor, retention, defaults_json)

    out, batched = await again_on_deadlock(once)
    for channel, opened in batched:  # counted once committed
        metrics.DEBOUNCED[channel, opened].inc()
    return out


async def _store(
    conn: Any, items: Sequence[Debounced], principal_id: str, actor: str, retention: float, defaults_json: str
) -> tuple[list[store.Stored], list[tuple[str, bool]]]:
    """The transaction's statements, in their order (debounce.sql says why that order); with each
    new event's (channel, whether it opened its batch)."""
    batches = await lock_batches(conn, items)
    ev = [d.event for d in items]
    recorded = await debounce_sql.record_debounced_events(
        conn,
        project_ids=[e.project_id for e in ev],
        channels=[e.channel for e in ev],
        provider_event_ids=[e.provider_event_id for e in ev],
        run_ids=[batches[_key(d)][0] for d in items],
    )
    new = {(r["project_id"], r["channel_type"], r["provider_event_id"]) for r in recorded}
    out: list[store.Stored | None] = [None] * len(items)
    fresh = [i for i, e in enumerate(ev) if (e.project_id, e.channel, e.provider_event_id) in new]
    for i in fresh:
        out[i] = store.Stored(str(batches[_key(items[i])][0]), True, None)
    await _answer_duplicates(conn, ev, [i for i, x in enumerate(out) if x is None], out, retention)
    batched = await write_batches(conn, [items[i] for i in fresh], batches, principal_id, actor, defaults_json)
    return out, batched  # type: ignore[return-value]  # every slot is filled: recorded now, or before


def _key(d: Debounced) -> Key:
    return (d.event.project_id, d.event.channel, d.key)


Batches = dict[Key, tuple[UUID, datetime | None, dict[str, Any] | None]]


async def lock_batches(conn: Any, items: Sequence[Debounced]) -> Batches:
    """The first two statements of the transaction: each key's batch, locked: (its run, when it
    opened, its input so far) for an open one, (a new run id, None, None) for a key that opens one."""
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
    open_inputs = {r["run_id"]: json.loads(r["input"]) for r in rows}
    batches: Batches = {}
    for k, new_id in zip(keys, store.new_run_ids(len(keys)), strict=True):
        run_id, opened_at = last[k]
        if run_id is not None and run_id in open_inputs:
            batches[k] = (run_id, opened_at, open_inputs[run_id])
        else:
            batches[k] = (new_id, None, None)
    return batches


def run_of(batches: Batches, d: Debounced) -> UUID:
    """The run of the batch d goes to."""
    return batches[_key(d)][0]


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


async def write_batches(
    conn: Any,
    fresh: list[Debounced],
    batches: Batches,
    principal_id: str,
    actor: str,
    defaults_json: str,
) -> list[tuple[str, bool]]:
    """Opens or grows each batch that new events (fresh, in arrival order) joined: one statement.
    Returns each event's (channel, whether it opened its batch)."""
    joined: dict[Key, list[Debounced]] = {}
    for d in fresh:
        joined.setdefault(_key(d), []).append(d)
    if not joined:
        return []
    ks = list(joined)
    firsts = [joined[k][0] for k in ks]  # a new batch's run takes its first event's options
    inputs = []
    full = []
    batched = []
    for k in ks:
        _, opened_at, prior = batches[k]
        ds = joined[k]
        data = batch_input(k[2], ds[-1].rule.mode, prior, [json.loads(d.event.input_json) for d in ds])
        inputs.append(json.dumps(data))
        full.append(data["debounce"]["count"] >= MAX_BATCH_EVENTS)
        batched += [(d.event.channel, opened_at is None and n == 0) for n, d in enumerate(ds)]
    await debounce_sql.write_batches(
        conn,
        run_ids=[batches[k][0] for k in ks],
        opened_ats=[batches[k][1] for k in ks],
        project_ids=[k[0] for k in ks],
        channels=[k[1] for k in ks],
        keys=[k[2] for k in ks],
        provider_event_ids=[d.event.provider_event_id for d in firsts],
        inputs=inputs,
        window_secs=[joined[k][-1].rule.window for k in ks],
        fulls=full,
        max_wait_secs=[joined[k][-1].rule.max_wait for k in ks],
        max_attempts=[d.event.max_attempts for d in firsts],
        priorities=[d.event.options.priority for d in firsts],
        retry_policies=[d.event.options.retry_policy_json for d in firsts],
        concurrency_keys=store.joined_keys([d.event for d in firsts]),
        traceparents=store.traceparents([d.event for d in firsts]),
        auto_upgrades=[d.event.options.auto_upgrade for d in firsts],
        policy_defaults=defaults_json,
        principal_id=principal_id,
        actor=actor,
    )
    return batched
