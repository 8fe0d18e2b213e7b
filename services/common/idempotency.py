"""The idempotent-mutation engine (seed 003; docs/architecture.md, "Idempotency"): any mutating RPC
can run its change through `run_idempotent` so that a retried request with the same key
replays the first answer instead of changing anything twice.

    outcome = await run_idempotent(
        pool,
        scope=Scope(project_id, principal.principal_type, principal.principal_id, "ingest.CreateRun", key),
        fingerprint=fingerprint({"project_id": ..., "input": ..., "max_attempts": ...}),
        policy_version=settings.policy_version,
        ttl=settings.idempotency_ttl,
        deadline=time.monotonic() + context.time_remaining(),   # or None
        recheck=lambda conn: has_role_now(conn, principal, project_id, "ingest"),
        execute=create_the_thing,   # async (conn, KeyWindow) -> Executed(snapshot bytes, resource id)
    )
    response = MyResponse.FromString(outcome.snapshot); response.replayed = outcome.replayed

What happens, all in ONE transaction on one connection:
1. `pg_advisory_xact_lock(hashtextextended(<scope>, 0))` serializes every request of the same
   scope (project, principal type, principal id, operation, key). A request that arrives while
   the first is in flight waits here; `lock_timeout` is set from the caller's deadline, and a
   wait that outlives it is DEADLINE_EXCEEDED (never INTERNAL).
2. The key row is read in a new statement (so it sees what the previous holder committed).
   An expired row (expires_at <= now()) is deleted and treated as absent.
3. Row present -> `replay()`, in this order: `recheck(conn)` (the caller's current membership,
   read fresh; False -> PERMISSION_DENIED / FORBIDDEN and nothing from the snapshot leaves), then
   the policy version and the request fingerprint (a mismatch -> ALREADY_EXISTS /
   IDEMPOTENCY_CONFLICT with metadata first_seen_at, expires_at and differs=fingerprint|policy_version),
   then the stored snapshot with replayed=True.
4. Row absent -> `execute(conn, window)` performs the mutation on the same connection (its audit
   rows too) and returns the serialized response; the key row (fingerprint, policy version,
   snapshot, resource id, created_at = now(), expires_at = now() + ttl) is inserted; both commit
   together. `window` carries those two timestamps so the snapshot can include them.
A unique violation on the key row cannot happen under the lock; should one ever occur the whole
transaction is retried once (and then replays), so it never reaches a caller.

Batches of API-channel events take the same rules a whole batch at a time, in one statement
(services/ingest/api_channel.py): there the key table's unique index serializes a scope instead
of the advisory lock (seed 003 allows either), and each event's replay is decided by the same
`replay()`.

Expired rows are also removed in bounded batches by the ingest service's retention loop.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import asyncpg
from google.protobuf import timestamp_pb2

from services.common import errors, idempotency_sql
from services.common.db import Conn

# Leave the server this much of the caller's deadline to answer after a lock wait.
DEADLINE_MARGIN = 0.05


@dataclass(frozen=True, slots=True)
class Scope:
    """Who may replay whom: the unique key of awooop_idempotency_key."""

    project_id: str
    principal_type: str
    principal_id: str
    operation: str  # e.g. "ingest.CreateRun"; <= 64 chars
    key: str  # caller's idempotency key; <= 256 chars

    def lock_name(self) -> str:
        # \x1f cannot be confused with key text in practice; a collision only serializes more
        return "\x1f".join(
            ("awooop_idem", self.project_id, self.principal_type, self.principal_id, self.operation, self.key)
        )


@dataclass(frozen=True, slots=True)
class KeyWindow:
    """The key's created_at (= the transaction's now()) and expires_at, known before execute runs."""

    created_at: dt.datetime
    expires_at: dt.datetime


@dataclass(frozen=True, slots=True)
class Executed:
    snapshot: bytes  # the serialized response, replayed as is
    resource_id: str | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    snapshot: bytes
    replayed: bool
    created_at: dt.datetime
    expires_at: dt.datetime
    resource_id: str | None


Recheck = Callable[[Conn], Awaitable[bool]]
Execute = Callable[[Conn, KeyWindow], Awaitable[Executed]]


def fingerprint(payload: Any) -> str:
    """Hex SHA-256 of the canonical JSON (sorted keys, no whitespace, UTF-8) of payload: the fields
    that define the mutation, never the key itself."""
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class StoredKey:
    """A live key row: what the first request of a scope left for its replays."""

    fingerprint: str
    policy_version: str
    snapshot: bytes
    resource_id: str | None
    created_at: dt.datetime
    expires_at: dt.datetime


def no_longer_authorized(scope: Scope) -> errors.ServiceError:
    """The refusal of a replay whose caller lost its membership since the key was stored."""
    return errors.forbidden(
        f"principal {scope.principal_id} is no longer authorized for {scope.operation} in project {scope.project_id}",
        project_id=scope.project_id,
        operation=scope.operation,
    )


def replay(scope: Scope, stored: StoredKey, *, fingerprint: str, policy_version: str, allowed: bool) -> Outcome:
    """Seed 003's answer to a request whose scope has a live key, in this order: the caller's
    membership read fresh from the store (`allowed`; False -> FORBIDDEN and nothing from the
    snapshot leaves), then the policy version and the fingerprint (-> IDEMPOTENCY_CONFLICT), then
    the stored snapshot with replayed=True. Raises the refusal as a ServiceError."""
    if not allowed:
        raise no_longer_authorized(scope)
    differs = []
    if stored.policy_version != policy_version:
        differs.append("policy_version")
    if stored.fingerprint != fingerprint:
        differs.append("fingerprint")
    if differs:
        raise errors.idempotency_conflict(
            f"idempotency key was first used at {_iso(stored.created_at)} with a different "
            f"{' and '.join(d.replace('_', ' ') for d in differs)}; use a new key for a different request",
            first_seen_at=_iso(stored.created_at),
            expires_at=_iso(stored.expires_at),
            differs=",".join(differs),
            operation=scope.operation,
        )
    return Outcome(stored.snapshot, True, stored.created_at, stored.expires_at, stored.resource_id)


async def run_idempotent(
    pool: asyncpg.Pool,
    *,
    scope: Scope,
    fingerprint: str,
    policy_version: str,
    ttl: float,
    recheck: Recheck,
    execute: Execute,
    deadline: float | None = None,
) -> Outcome:
    """Runs execute at most once per live key of scope; see the module docstring.
    deadline is a time.monotonic() instant (None: bounded by the statement timeout only)."""
    for attempt in range(2):
        try:
            return await _attempt(pool, scope, fingerprint, policy_version, ttl, recheck, execute, deadline)
        except _KeyRace:
            if attempt:
                raise errors.store_unavailable("idempotency key contended, retry") from None
        except asyncpg.exceptions.LockNotAvailableError:
            # lock_timeout (the caller's remaining deadline) covers every lock wait of the transaction
            raise errors.deadline_exceeded(
                "a request with the same idempotency key (or a row it needs) was still locked at the deadline"
            ) from None
    raise AssertionError("unreachable")


class _KeyRace(Exception):
    pass


async def _attempt(
    pool: asyncpg.Pool,
    scope: Scope,
    fp: str,
    policy_version: str,
    ttl: float,
    recheck: Recheck,
    execute: Execute,
    deadline: float | None,
) -> Outcome:
    s = scope
    async with pool.acquire() as conn, conn.transaction():
        await idempotency_sql.lock_scope(conn, lock_timeout=_lock_timeout(deadline), lock_name=s.lock_name())
        row = await idempotency_sql.lookup_key(
            conn,
            project_id=s.project_id,
            principal_type=s.principal_type,
            principal_id=s.principal_id,
            operation=s.operation,
            key=s.key,
            ttl=float(ttl),
        )
        assert row is not None  # one row always
        stored = live_key(
            row["request_fingerprint"],
            row["policy_version"],
            row["response_snapshot"],
            row["resource_id"],
            row["created_at"],
            row["expires_at"],
        )
        if stored is not None:
            return replay(s, stored, fingerprint=fp, policy_version=policy_version, allowed=await recheck(conn))
        window = KeyWindow(row["window_start"], row["window_end"])
        done = await execute(conn, window)
        try:
            await idempotency_sql.insert_key(
                conn,
                project_id=s.project_id,
                principal_type=s.principal_type,
                principal_id=s.principal_id,
                operation=s.operation,
                key=s.key,
                fingerprint=fp,
                policy_version=policy_version,
                snapshot=done.snapshot,
                resource_id=done.resource_id,
                created_at=window.created_at,
                expires_at=window.expires_at,
            )
        except asyncpg.UniqueViolationError:
            raise _KeyRace() from None  # leaving the block rolls the whole attempt back
        return Outcome(done.snapshot, False, window.created_at, window.expires_at, done.resource_id)


def live_key(
    fp: str | None,
    policy_version: str | None,
    snapshot: bytes | None,
    resource_id: str | None,
    created_at: dt.datetime | None,
    expires_at: dt.datetime | None,
) -> StoredKey | None:
    """The live key a statement read through an outer join (LookupKey, IngestApiEvents); None when
    there is none (its columns are then NULL together; only resource_id may be NULL in a row)."""
    if fp is None or policy_version is None or snapshot is None or created_at is None or expires_at is None:
        return None
    return StoredKey(fp, policy_version, snapshot, resource_id, created_at, expires_at)


def _lock_timeout(deadline: float | None) -> str:
    """lock_timeout in ms for the remaining deadline ("0" = no limit beyond statement_timeout)."""
    if deadline is None:
        return "0"
    remaining = deadline - time.monotonic() - DEADLINE_MARGIN
    if remaining <= 0:
        raise errors.deadline_exceeded("the call's deadline passed before the request could run")
    return str(max(1, int(remaining * 1000)))


def _iso(value: dt.datetime) -> str:
    """RFC 3339, exactly as the same instant prints as a protobuf Timestamp in JSON."""
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(value)
    return t.ToJsonString()
