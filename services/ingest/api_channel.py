"""API-channel events (IngestEvent / IngestEvents with channel API, and POST
/v1/projects/{project_id}/events): seed 003's rules, the same rules as CreateRun's engine
(services/common/idempotency.py), for a whole batch in one statement.

- The key is scoped to (project, principal type, principal id, "ingest.IngestEvent", key):
  two principals of one project using the same key get two runs.
- The request fingerprint is SHA-256 of the canonical (project_id, input, max_attempts): the
  same key with another payload is IDEMPOTENCY_CONFLICT (409 over HTTP).
- A replay re-reads the caller's membership from the store in the statement that reads the key;
  a revoked caller gets PERMISSION_DENIED (403) at once. No answer comes from Redis or the
  process's memory of recent ids, so the API-key cache opens no window for replays.
- Each event is answered alone: a refused event is its own answer and its neighbours are stored.

A batch (one event for IngestEvent and HTTP) is one IngestApiEvents statement (api_channel.sql):
the unique index of the key table serializes requests of one scope, as the engine's advisory lock
does, and the replay decision is the engine's own (idempotency.replay). Events whose key another
request committed while the statement ran are sent once more, in one more statement, whose
snapshot sees that key and replays it; so ten parallel requests with one key make one run and nine
replays. Repeats of a key inside one batch answer as if sent one after another: the first decides,
the others replay what it left (or meet the same refusal).

These events have no awooop_channel_event_dedupe row: their dedupe is the idempotency key
table. Keys recorded before this rule by the channel dedupe table (project, 'api', key) still
answer as duplicates for the principal that created the run, with the same fingerprint and
membership checks (the run's input and max_attempts are the fingerprint's fields); the first
such replay records the key so later replays take the ordinary path.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg

from services.common import errors, idempotency, retry_policy
from services.common.auth import IMPLIED, Principal
from services.common.db import again_on_deadlock
from services.common.idempotency import StoredKey
from services.common.principals import ALL_PROJECTS
from services.common.settings import Settings
from services.ingest import api_channel_sql, debounce, metrics, store
from services.ingest.parsing import NewEvent

T = TypeVar("T")
OPERATION = "ingest.IngestEvent"
ROLE = "ingest"
# the roles whose membership carries ROLE (as has_role_now reads them)
ROLES = [r for r, implied in IMPLIED.items() if ROLE in implied] + [ROLE]
# Statements per batch for events whose key row another request committed meanwhile; the second
# settles them unless the row is pruned in between (an expired key), which the third covers.
MAX_ATTEMPTS = 3

# (run_id, duplicate), or the event's own refusal
Answer = tuple[str, bool] | errors.ServiceError


def fingerprint(project_id: str, input_value: object, max_attempts: int) -> str:
    return idempotency.fingerprint({"project_id": project_id, "input": input_value, "max_attempts": max_attempts})


@dataclass(slots=True)
class _Legacy:
    """An old-rule key's run (the dedupe row of the previous release)."""

    run_id: str
    input_json: str
    max_attempts: int


@dataclass(slots=True)
class _Key:
    """One distinct (project, key) of a batch: what its first event found or left."""

    event: int  # the index of its first event
    allowed: bool = False  # the caller's membership, read by the statement
    stored: StoredKey | None = None  # the live key row after the first event
    legacy: _Legacy | None = None
    window: tuple[dt.datetime, dt.datetime] | None = None  # a key row's created_at and expires_at now
    recorded: StoredKey | None = None  # an old-rule key to record (its replay passed)
    debounced: debounce.Debounced | None = None  # how a debounce rule batches its first event
    created: bool = False  # its first event claimed the key (a new event)


class ApiEvents:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, rules: debounce.Rules | None = None) -> None:
        self.pool = pool
        self.settings = settings
        self.rules = rules  # debounce rules (None: no event is debounced)
        self.defaults_json = json.dumps(retry_policy.defaults(settings))  # the service's retry policy

    async def ingest(self, events: Sequence[NewEvent], principal: Principal, created: set[str]) -> list[Answer]:
        """answers[i] answers events[i] (all API events of one caller). The projects of the runs
        created are added to `created` as soon as they are stored (an outage of a later statement
        raises, and the caller still wakes the workers for those)."""
        scopes = [self._scope(e, principal) for e in events]
        fps = [fingerprint(e.project_id, json.loads(e.input_json), e.max_attempts) for e in events]
        keys: list[_Key] = []
        slot: list[int] = []  # events[i] -> its key in keys
        first: dict[tuple[str, str], int] = {}
        for i, e in enumerate(events):
            j = first.setdefault((e.project_id, e.provider_event_id), len(keys))
            if j == len(keys):
                keys.append(_Key(i))
            slot.append(j)
        answers: list[Answer | None] = [None] * len(events)
        if self.rules is not None:
            for k, d in zip(keys, await self.rules.split([events[k.event] for k in keys]), strict=True):
                k.debounced = d

        pending = keys
        for _ in range(MAX_ATTEMPTS):
            if any(k.debounced for k in pending):
                left = await self._debounced(pending, events, fps, principal, answers, created)
            else:
                left = await self._statement(pending, events, fps, principal, answers, created)
            pending = [pending[n] for n in left]
            if not pending:
                break
        else:
            raise errors.store_unavailable("idempotency keys changed under the request; retry")

        for i, j in enumerate(slot):  # the repeats, in the order sent
            k = keys[j]
            if i == k.event:
                continue
            if k.stored is not None:
                answers[i] = _replayed(scopes[i], k.stored, fps[i], self.settings.policy_version, k.allowed)
            else:  # only an old-rule key whose earlier events were refused has no key row yet
                answers[i] = self._legacy(k, i, scopes[i], events[i], fps[i])

        recorded = [k for k in keys if k.recorded is not None]
        if recorded:
            await self._record_legacy(recorded, events, principal)
        return answers  # type: ignore[return-value]  # every event is answered

    async def _debounced(
        self,
        batch: list[_Key],
        events: Sequence[NewEvent],
        fps: list[str],
        principal: Principal,
        answers: list[Answer | None],
        created: set[str],
    ) -> list[int]:
        """_statement for a batch holding debounced events, in one transaction with their batches
        (services/ingest/debounce.py): the keys' batches locked first, each debounced event's key
        claimed for its batch's run, then the batches its new events joined opened or grown."""

        async def once() -> tuple[list[int], list[tuple[str, bool]]]:
            for k in batch:  # what a rolled-back attempt (a deadlock) decided is undone
                k.created = False
            async with self.pool.acquire() as conn, conn.transaction():
                items = [k.debounced for k in batch if k.debounced]
                batches = await debounce.lock_batches(conn, items)
                locked = list(batches.values())  # plan replaces a full one in the dict
                planned = debounce.plan(items, batches, self.settings.max_payload_bytes)
                runs = {id(d): b for d, b in zip(items, planned, strict=True)}
                left = await self._statement(batch, events, fps, principal, answers, created, conn, runs)
                for k in batch:
                    if k.debounced and k.created:
                        runs[id(k.debounced)].events.append(k.debounced)
                touched = debounce.touched(locked, planned)
                grown = await debounce.write_batches(
                    conn, touched, principal.principal_id, principal.actor, self.defaults_json
                )
                return left, grown

        left, grown = await again_on_deadlock(once)
        for channel, opened in grown:  # counted once committed
            metrics.DEBOUNCED[channel, opened].inc()
        return left

    async def _statement(
        self,
        batch: list[_Key],
        events: Sequence[NewEvent],
        fps: list[str],
        principal: Principal,
        answers: list[Answer | None],
        created: set[str],
        conn: Any = None,
        runs: dict[int, debounce.Batch] | None = None,
    ) -> list[int]:
        """One IngestApiEvents for the first events of batch's keys; answers those it settles and
        returns the positions in batch it left unanswered (a key committed after its snapshot).
        Long because the statement takes one array per column of the batch (24 parameters) and
        each of its rows is settled right below, against the same arrays it indexes."""
        ev = [events[k.event] for k in batch]
        run_ids = [str(u) for u in store.new_run_ids(len(ev))]
        for n, k in enumerate(batch):  # a debounced event's run is its batch's (conn: their transaction)
            if k.debounced and runs is not None:
                run_ids[n] = str(runs[id(k.debounced)].run_id)
        snapshots = [_snapshot(r, legacy=False) for r in run_ids]
        s = self.settings
        call = again_on_deadlock if conn is None else _once  # a transaction is retried whole
        rows = await call(
            lambda: api_channel_sql.ingest_api_events(
                conn or self.pool,
                ord=list(range(len(ev))),
                project_id=[e.project_id for e in ev],
                key=[e.provider_event_id for e in ev],
                run_id=run_ids,
                input=[e.input_json for e in ev],
                max_attempts=[e.max_attempts for e in ev],
                not_before=[e.options.not_before for e in ev],
                priority=[e.options.priority for e in ev],
                retry_policy=[e.options.retry_policy_json for e in ev],
                concurrency_keys=store.joined_keys(ev),
                traceparent=store.traceparents(ev),
                auto_upgrade=[e.options.auto_upgrade for e in ev],
                required_labels=[e.options.required_labels_json for e in ev],
                preferred_labels=[e.options.preferred_labels_json for e in ev],
                debounced=[k.debounced is not None for k in batch],
                fingerprint=[fps[k.event] for k in batch],
                snapshot=snapshots,
                principal_type=principal.principal_type,
                principal_id=principal.principal_id,
                actor=principal.actor,
                operation=OPERATION,
                policy_version=s.policy_version,
                ttl=float(s.idempotency_ttl),
                retention=float(s.dedupe_retention),
                defaults=self.defaults_json,
                all_projects=ALL_PROJECTS,
                roles=ROLES,
            ),
        )
        left = []
        for r in rows:
            n = r["ord"]
            k, e = batch[n], ev[n]
            i = k.event
            k.allowed = r["allowed"]
            k.window = (r["window_start"], r["window_end"])
            live = idempotency.live_key(
                r["request_fingerprint"],
                r["policy_version"],
                r["response_snapshot"],
                r["resource_id"],
                r["created_at"],
                r["expires_at"],
            )
            if r["created"]:
                k.created = True
                k.stored = StoredKey(
                    fps[i], s.policy_version, snapshots[n], run_ids[n], r["window_start"], r["window_end"]
                )
                answers[i] = (run_ids[n], False)
                created.add(e.project_id)
            elif live is not None:
                k.stored = live
                answers[i] = _replayed(self._scope(e, principal), k.stored, fps[i], s.policy_version, k.allowed)
            elif (legacy := _legacy_run(r)) is not None:
                k.legacy = legacy
                answers[i] = self._legacy(k, i, self._scope(e, principal), e, fps[i])
            else:
                left.append(n)
        return left

    def _legacy(self, k: _Key, i: int, scope: idempotency.Scope, e: NewEvent, fp: str) -> Answer:
        """An old-rule key's replay: the membership, then the fingerprint against the run's fields.
        The first that passes leaves the key row its replays meet (recorded after the batch)."""
        legacy = k.legacy
        assert legacy is not None and k.window is not None
        if not k.allowed:
            return idempotency.no_longer_authorized(scope)
        # the run stored its effective max_attempts; a request that leaves it unset (0) asked for
        # whatever the policy gave, so only a different explicit value differs
        asked = e.max_attempts or legacy.max_attempts
        theirs = fingerprint(e.project_id, json.loads(legacy.input_json), legacy.max_attempts)
        if fingerprint(e.project_id, json.loads(e.input_json), asked) != theirs:
            return errors.idempotency_conflict(
                "idempotency key was first used with a different payload; use a new key for a different request",
                differs="fingerprint",
                operation=OPERATION,
            )
        snapshot = _snapshot(legacy.run_id, legacy=True)
        k.stored = k.recorded = StoredKey(fp, self.settings.policy_version, snapshot, legacy.run_id, *k.window)
        return (legacy.run_id, True)

    async def _record_legacy(self, keys: list[_Key], events: Sequence[NewEvent], principal: Principal) -> None:
        """Records the replayed old-rule keys (one statement), so later replays take the ordinary path."""
        rows = [(events[k.event], k.recorded) for k in keys if k.recorded is not None]  # one project and key per k
        s = self.settings
        await again_on_deadlock(
            lambda: api_channel_sql.record_legacy_api_keys(
                self.pool,
                project_id=[e.project_id for e, _ in rows],
                key=[e.provider_event_id for e, _ in rows],
                fingerprint=[x.fingerprint for _, x in rows],
                snapshot=[x.snapshot for _, x in rows],
                resource_id=[x.resource_id for _, x in rows],
                principal_type=principal.principal_type,
                principal_id=principal.principal_id,
                operation=OPERATION,
                policy_version=s.policy_version,
                ttl=float(s.idempotency_ttl),
            ),
        )

    @staticmethod
    def _scope(e: NewEvent, principal: Principal) -> idempotency.Scope:
        return idempotency.Scope(
            e.project_id, principal.principal_type, principal.principal_id, OPERATION, e.provider_event_id
        )


async def _once(call: Callable[[], Awaitable[T]]) -> T:
    return await call()


def _legacy_run(r: api_channel_sql.IngestApiEventsRow) -> _Legacy | None:
    """The old-rule key's run the statement found for the event, if any (outer-joined: its columns
    are NULL together when there is none)."""
    run_id, input_json, max_attempts = r["legacy_run_id"], r["legacy_input"], r["legacy_max_attempts"]
    if run_id is None or input_json is None or max_attempts is None:
        return None
    return _Legacy(str(run_id), input_json, max_attempts)


def _replayed(scope: idempotency.Scope, stored: StoredKey, fp: str, policy_version: str, allowed: bool) -> Answer:
    """The engine's replay rule for one event: its run, or its refusal."""
    try:
        outcome = idempotency.replay(scope, stored, fingerprint=fp, policy_version=policy_version, allowed=allowed)
    except errors.ServiceError as exc:
        return exc
    return (str(json.loads(outcome.snapshot)["run_id"]), True)


def _snapshot(run_id: str, *, legacy: bool) -> bytes:
    return json.dumps({"run_id": run_id, "legacy": legacy}).encode()
