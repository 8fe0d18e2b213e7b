"""Event ingest: every channel event becomes exactly one run.

Per call: the events' keys are looked up in the process's own memory of recent answers
(recent.RecentKeys), then in Redis (a hit is a committed duplicate, answered without Postgres)
while duplicates are common enough for that to pay (lookup_gate.LookupGate; unique events then
skip the Redis round trip); the misses go to Postgres (store.sql: StoreEvents), whose unique
constraint decides; what Postgres answered is then cached for the next duplicate, and the projects
with new runs are handed to the wake-up notifier.

Concurrent calls share round trips (services/ingest/coalesce.py): lookups of calls arriving
together go in one MGET, their misses in one StoreEvents statement (per calling principal,
which the statement records as the runs' creator), their cache writes in one command. Two
occurrences of one key in a flush, from one call or two, are one event: the first creates
the run and the others are its duplicates.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import asyncpg
import grpc

from services.common import errors, retry_policy, tracing
from services.common.auth import Principal
from services.common.cache import Cache
from services.common.db import store_error
from services.common.settings import Settings
from services.ingest import debounce, dedupe_cache, metrics, store
from services.ingest.api_channel import ApiEvents
from services.ingest.coalesce import Coalescer
from services.ingest.lookup_gate import LookupGate
from services.ingest.parsing import NewEvent
from services.ingest.recent import RecentKeys
from services.ingest.wakeup import Notifier

DUPLICATE_CODE = "E-IDEMPOTENT-001"
# Flushes in flight at once per kind; what arrives meanwhile is coalesced into the next one.
# One is the measured best on 2 cores (larger flushes beat parallel small ones for both
# single-event and batch load); the statements it waits behind are short autocommits.
REDIS_IN_FLIGHT = 1
STORE_IN_FLIGHT = 1
# Under load (a flush ended with events already waiting), the next flush waits this long for
# more: unique IngestEvent +21-23% on 2 cores, 1 ms and 2 ms alike; idle, nothing waits.
LINGER = 0.001


@dataclass(slots=True)
class Outcome:
    run_id: str
    provider_event_id: str
    duplicate: bool


class EventIngestor:
    def __init__(self, pool: asyncpg.Pool, cache: Cache, settings: Settings, notifier: Notifier) -> None:
        self.pool = pool
        self.cache = cache
        self.notifier = notifier
        self.retention = settings.dedupe_retention
        self.policy_defaults = json.dumps(retry_policy.defaults(settings))
        # a Redis key must never claim a duplicate for a row retention already removed
        self.redis_ttl = min(settings.redis_dedupe_ttl, settings.dedupe_retention)
        self.max_flush = settings.max_batch
        self.max_payload_bytes = settings.max_payload_bytes  # a debounced batch's input stays within it
        self.recent = RecentKeys(settings.dedupe_memory_keys)
        self.gate = LookupGate()
        self._lookups: Coalescer[str, tuple[str, float] | None] = Coalescer(
            self._lookup, max_in_flight=REDIS_IN_FLIGHT, max_items=max(1000, settings.max_batch), linger=LINGER
        )
        self._remember: Coalescer[tuple[str, str, float], None] = Coalescer(
            self._write_cache, max_in_flight=REDIS_IN_FLIGHT, max_items=max(1000, settings.max_batch), linger=LINGER
        )
        self._writers: dict[str, Coalescer[tuple[NewEvent, str], store.Stored]] = {}
        self.debounce = debounce.Rules(pool, settings.debounce_rule_cache_seconds)
        self.api = ApiEvents(pool, settings, self.debounce)

    async def ingest(
        self, events: Sequence[NewEvent], *, principal_id: str, actor: str, principal: Principal | None = None
    ) -> Sequence[Outcome]:
        """outcome[i] answers events[i]; the first refusal of an API-channel event is raised."""
        if events and tracing.current_traceparent() is None and all(e.channel != "api" for e in events):
            return await self._channel(events, principal_id, actor)  # no refusal to look for
        answers = await self.ingest_each(events, principal_id=principal_id, actor=actor, principal=principal)
        for a in answers:
            if isinstance(a, errors.ServiceError):
                raise a
        return cast("Sequence[Outcome]", answers)  # no refusal among them

    async def ingest_each(
        self, events: Sequence[NewEvent], *, principal_id: str, actor: str, principal: Principal | None = None
    ) -> Sequence[Outcome | errors.ServiceError]:
        """answers[i] answers events[i]: its outcome, or the refusal of an API-channel event
        (refused()), which leaves the other events ingested. API-channel events follow seed 003
        (api_channel.py) and need the calling principal; the other channels take the channel
        dedupe path below. A store outage raises: which events were stored is then unknown."""
        if not events:  # e.g. LINE's webhook verification: a delivery without events
            return []
        traceparent = tracing.current_traceparent()
        if traceparent is not None:  # the run's trace continues the span that received the event
            for e in events:
                e.traceparent = traceparent
        if any(e.channel == "api" for e in events):
            return await self._with_api(events, principal_id, actor, principal)
        return await self._channel(events, principal_id, actor)

    async def _channel(self, events: Sequence[NewEvent], principal_id: str, actor: str) -> list[Outcome]:
        recent = self.recent
        out: list[Outcome | None] = []
        unknown: list[tuple[int, NewEvent, str]] = []  # (index, event, dedupe key) not in memory
        for i, e in enumerate(events):
            key = dedupe_cache.key(self.cache, e.project_id, e.channel, e.provider_event_id)
            run_id = recent.get(key)
            if run_id is None:
                unknown.append((i, e, key))
                out.append(None)
            else:
                metrics.DUPLICATE[e.channel].inc()
                metrics.DEDUPE_ANSWERS[e.channel, "memory", True].inc()
                out.append(Outcome(run_id, e.provider_event_id, True))
        if unknown and self.cache.enabled:
            if self.gate.open:
                unknown = self._redis_answers(await self._lookups.submit([k for _, _, k in unknown]), unknown, out)
            else:
                metrics.REDIS_SKIPPED.inc(len(unknown))
        if unknown:
            # Postgres answers the rest; the flush counts, remembers and announces its answers
            stored = await self._writer(principal_id, actor).submit([(e, k) for _, e, k in unknown])
            for (i, e, _), st in zip(unknown, stored, strict=True):
                out[i] = Outcome(st.run_id, e.provider_event_id, not st.created)
        return out  # type: ignore[return-value]  # every slot is filled: memory, Redis or Postgres

    def _redis_answers(
        self,
        cached: Sequence[tuple[str, float] | None],
        unknown: list[tuple[int, NewEvent, str]],
        out: list[Outcome | None],
    ) -> list[tuple[int, NewEvent, str]]:
        """Fills the events Redis knew (duplicates) into out; returns those it did not."""
        misses = []
        for item, hit in zip(unknown, cached, strict=True):
            if hit is None:
                misses.append(item)
                continue
            i, e, key = item
            self.recent.put(key, *hit)
            metrics.DUPLICATE[e.channel].inc()
            metrics.DEDUPE_ANSWERS[e.channel, "redis", True].inc()
            out[i] = Outcome(hit[0], e.provider_event_id, True)
        if len(misses) < len(unknown):  # what Redis answered: how often asking it first paid
            self.gate.observe(len(unknown) - len(misses), len(unknown) - len(misses))
        return misses

    async def _with_api(
        self, events: Sequence[NewEvent], principal_id: str, actor: str, principal: Principal | None
    ) -> list[Outcome | errors.ServiceError]:
        if principal is None:
            raise errors.internal("API-channel events need the calling principal")
        out: list[Outcome | errors.ServiceError | None] = [None] * len(events)
        others = [i for i, e in enumerate(events) if e.channel != "api"]
        if others:
            for i, o in zip(others, await self._channel([events[i] for i in others], principal_id, actor), strict=True):
                out[i] = o
        api = [i for i, e in enumerate(events) if e.channel == "api"]
        ready: set[str] = set()
        try:  # one statement for the whole batch (api_channel.py); each event answered alone
            answers = await self.api.ingest([events[i] for i in api], principal, ready)
        finally:  # the runs created before an outage are claimable all the same
            self.notifier.ready(ready)
        for i, answer in zip(api, answers, strict=True):
            if isinstance(answer, errors.ServiceError):
                if not refused(answer):
                    raise answer
                out[i] = answer
                continue
            run_id, duplicate = answer
            (metrics.DUPLICATE if duplicate else metrics.CREATED)["api"].inc()
            out[i] = Outcome(run_id, events[i].provider_event_id, duplicate)
        return out  # type: ignore[return-value]  # every slot is filled: api or not

    async def drain(self) -> None:
        """Finishes queued flushes (cache writes included) before the store and Redis close."""
        coalescers: list[Coalescer[Any, Any]] = [self._lookups, *self._writers.values(), self._remember]
        for c in coalescers:
            await c.drain()

    def _writer(self, principal_id: str, actor: str) -> Coalescer[tuple[NewEvent, str], store.Stored]:
        writer = self._writers.get(actor)
        if writer is None:

            async def flush(items: list[tuple[NewEvent, str]]) -> list[store.Stored]:
                return await self._store(items, principal_id, actor)

            # one caller's refused item must not fail its neighbours: only an outage is shared
            writer = self._writers[actor] = Coalescer(
                flush, max_in_flight=STORE_IN_FLIGHT, max_items=self.max_flush, shared=_store_outage, linger=LINGER
            )
        return writer

    async def _store(self, items: list[tuple[NewEvent, str]], principal_id: str, actor: str) -> list[store.Stored]:
        """One statement for a flush of (event, dedupe key); repeats of a key are duplicates of
        its first occurrence. Then, once for the whole flush: the answers counted, remembered
        (this process's memory, Redis), the projects with new runs handed to the notifier, and
        the share of duplicates given to the lookup gate."""
        first: dict[str, int] = {}
        unique: list[NewEvent] = []
        slot: list[int] = []
        repeated: set[int] = set()
        for e, key in items:
            j = first.get(key)
            if j is None:
                j = first[key] = len(unique)
                unique.append(e)
            else:
                repeated.add(len(slot))
            slot.append(j)
        stored = await self._store_unique(unique, principal_id, actor)
        out = []
        remember = []
        ready: set[str] = set()
        counts: dict[tuple[str, bool], int] = {}
        recent = self.recent
        for n, j in enumerate(slot):
            s = stored[j]
            if n in repeated:
                left = self.retention if s.created else s.ttl_left
                s = store.Stored(s.run_id, False, left)
            out.append(s)
            e, key = items[n]
            if s.created:
                ready.add(e.project_id)
                ttl = self.redis_ttl
            else:
                ttl = min(self.redis_ttl, s.ttl_left or 0.0)
            remember.append((key, s.run_id, ttl))
            recent.put(key, s.run_id, ttl)
            counts[e.channel, s.created] = counts.get((e.channel, s.created), 0) + 1
        self.notifier.ready(ready)
        if self.cache.enabled:
            self._remember.submit_nowait(remember)
        duplicates = 0
        for (channel, created), count in counts.items():
            (metrics.CREATED if created else metrics.DUPLICATE)[channel].inc(count)
            metrics.DEDUPE_ANSWERS[channel, "postgres", not created].inc(count)
            duplicates += 0 if created else count
        # what Postgres answered: how often asking Redis first would have paid
        self.gate.observe(len(items), duplicates)
        return out

    async def _store_unique(self, unique: list[NewEvent], principal_id: str, actor: str) -> list[store.Stored]:
        """Events with distinct keys: those a debounce rule batches through debounce.py, the
        others through StoreEvents; result[i] answers unique[i]."""
        batched = await self.debounce.split(unique)
        plain = [i for i, d in enumerate(batched) if d is None]
        out: list[store.Stored | None] = [None] * len(unique)
        kw: dict[str, Any] = {
            "principal_id": principal_id,
            "actor": actor,
            "retention": self.retention,
            "defaults_json": self.policy_defaults,
        }
        if plain:
            for i, s in zip(plain, await store.ingest(self.pool, [unique[i] for i in plain], **kw), strict=True):
                out[i] = s
        if len(plain) < len(unique):
            held = [(i, d) for i, d in enumerate(batched) if d is not None]
            stored = await debounce.ingest(self.pool, [d for _, d in held], **kw, max_bytes=self.max_payload_bytes)
            for (i, _), s in zip(held, stored, strict=True):
                out[i] = s
        return out  # type: ignore[return-value]  # every slot is filled: one path or the other

    async def _lookup(self, keys: list[str]) -> list[tuple[str, float] | None]:
        return await dedupe_cache.lookup(self.cache, keys)

    async def _write_cache(self, entries: list[tuple[str, str, float]]) -> list[None]:
        await dedupe_cache.remember(self.cache, entries)
        return [None] * len(entries)


def refused(exc: errors.ServiceError) -> bool:
    """An API event's own refusal (a conflicting key, a revoked caller's replay): it answers that
    event alone. An outage or a bug fails the whole call."""
    return exc.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL)


def _store_outage(exc: Exception) -> bool:
    return store_error(exc) is not None
