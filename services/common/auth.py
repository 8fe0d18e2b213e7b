"""Authentication (bearer API keys) and per-project role checks.

The interceptor resolves `authorization: Bearer <key>` to a Principal and puts it in a
context variable for the handler. Verified keys are cached for AWOOOP_AUTH_CACHE_SECONDS
so hot paths (duplicate events answered from Redis) need no Postgres round trip; a
revoked key or role therefore stops working within that many seconds. Checks that must
be exact (the idempotency replay re-check of seed 003) read memberships fresh instead:
see `has_role_now`.
"""

from __future__ import annotations

import contextvars
import hmac
import time
from dataclasses import dataclass, field

import asyncpg

from services.common import auth_sql, errors
from services.common.db import Conn
from services.common.keyids import LiveKeyIds
from services.common.observability import AUTH_FAILURES
from services.common.principals import ALL_PROJECTS, hash_secret, parse_key

# admin implies every role
IMPLIED = {"admin": {"ingest", "worker", "approver", "admin", "tool"}}
# roles that make no member of a project (principals.TOOL_ROLE: it may complete waits, nothing else)
NARROW = frozenset({"tool"})


@dataclass(frozen=True)
class Principal:
    principal_id: str
    principal_type: str
    # project_id -> roles (the key "*" applies to every project)
    roles: dict[str, frozenset[str]] = field(default_factory=dict)
    # project_id -> roles_in(project_id): a principal is cached with its key and asked on every call
    _held: dict[str, frozenset[str]] = field(default_factory=dict, init=False, repr=False, compare=False)

    def roles_in(self, project_id: str) -> frozenset[str]:
        out = self._held.get(project_id)
        if out is None:
            held = self.roles.get(project_id, frozenset()) | self.roles.get(ALL_PROJECTS, frozenset())
            out = frozenset(held.union(*(IMPLIED.get(r, ()) for r in held)))
            if len(self._held) < 1000:  # a key with roles in many projects: remember the usual ones
                self._held[project_id] = out
        return out

    def member_of(self, project_id: str) -> bool:
        """Holds a role in the project that lets it read there (any but the narrow tool role)."""
        return bool(self.roles_in(project_id) - NARROW)

    def has(self, project_id: str, role: str) -> bool:
        return role in self.roles_in(project_id)

    @property
    def actor(self) -> str:
        return f"{self.principal_type}:{self.principal_id}"


_current: contextvars.ContextVar[Principal | None] = contextvars.ContextVar("awooop_principal", default=None)


def current_principal() -> Principal:
    p = _current.get()
    if p is None:  # only reachable if a handler runs without the interceptor
        raise errors.unauthenticated()
    return p


def set_principal(p: Principal | None) -> contextvars.Token[Principal | None]:
    return _current.set(p)


def reset_principal(token: contextvars.Token[Principal | None]) -> None:
    _current.reset(token)


class Authenticator:
    """Resolves keys to principals. Per request it costs the store nothing when the key was
    verified in the last cache_seconds; a key whose id is not live costs nothing either
    (keyids.LiveKeyIds: one refresh per interval for all of them); an existing key id is read
    at most once per cache_seconds whatever secrets are tried with it."""

    def __init__(self, pool: asyncpg.Pool, cache_seconds: float, key_refresh_seconds: float = 1.0) -> None:
        self.pool = pool
        self.cache_seconds = cache_seconds
        self.live = LiveKeyIds(pool, key_refresh_seconds)
        self._cache: dict[str, tuple[float, Principal]] = {}
        # key id -> (expires, sha256 of its secret, principal); (expires, None, None): not live
        self._by_id: dict[str, tuple[float, bytes | None, Principal | None]] = {}

    async def authenticate(self, authorization: str | None) -> Principal:
        if not authorization:
            raise _failed("missing", "missing authorization metadata: send 'authorization: Bearer <key>'")
        now = time.monotonic()
        hit = self._cache.get(authorization)  # by the header as sent: one verified needs no parsing
        if hit is not None and hit[0] > now:
            return hit[1]
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not key.strip():
            raise _failed("malformed", "authorization must be 'Bearer <key>'")
        principal = await self._verify(key.strip(), now)
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[authorization] = (now + self.cache_seconds, principal)
        return principal

    async def _verify(self, key: str, now: float) -> Principal:
        parsed = parse_key(key)
        if parsed is None:
            raise _failed("malformed", "malformed API key")
        key_id, secret = parsed
        if not await self.live.contains(key_id):
            hash_secret(secret)  # the same work as a wrong secret: timing does not reveal which ids exist
            raise _failed("unknown_key", "unknown or revoked API key")
        entry = self._by_id.get(key_id)
        if entry is None or entry[0] <= now:
            expected, principal = await self._load(key_id)
            if len(self._by_id) > 10000:
                self._by_id.clear()
            entry = self._by_id[key_id] = (now + self.cache_seconds, expected, principal)
        _, expected, principal = entry
        # compare even when the key id is not live, so timing does not reveal which ids exist
        if not hmac.compare_digest(expected or b"\x00" * 32, hash_secret(secret)) or principal is None:
            raise _failed("unknown_key" if principal is None else "wrong_secret", "unknown or revoked API key")
        return principal

    async def _load(self, key_id: str) -> tuple[bytes | None, Principal | None]:
        rows = await auth_sql.load_key(self.pool, key_id=key_id)
        if not rows:
            return None, None
        roles: dict[str, set[str]] = {}
        for r in rows:
            project, role = r["project_id"], r["role"]
            if project is not None and role is not None:  # both NULL: the principal holds no role
                roles.setdefault(project, set()).add(role)
        principal = Principal(
            rows[0]["principal_id"],
            rows[0]["principal_type"],
            {k: frozenset(v) for k, v in roles.items()},
        )
        return bytes(rows[0]["secret_sha256"]), principal


def _failed(reason: str, message: str) -> errors.ServiceError:
    AUTH_FAILURES.labels(reason).inc()
    return errors.unauthenticated(message)


async def has_role_now(conn: Conn, principal: Principal, project_id: str, role: str) -> bool:
    """Reads the principal's membership from the store now (no cache)."""
    wanted = [r for r, implied in IMPLIED.items() if role in implied] + [role]
    return await auth_sql.has_role_now(
        conn, principal_id=principal.principal_id, projects=[project_id, ALL_PROJECTS], roles=wanted
    )
