"""Webhook endpoints: the store side (create, list, rotate, remove) and the read-through cache
the HTTP handlers verify deliveries against.

An endpoint is (project_id, channel, name) with a provider secret. Rotation moves the current
secret to previous_secret, valid until previous_expires_at (the grace period), so a provider
can be switched to the new secret without dropped deliveries. Secrets leave the store only in
the answer to create or rotate (see the RPCs) and inside this process for verification.
"""

from __future__ import annotations

import datetime as dt
import secrets
import time
from dataclasses import dataclass

import asyncpg

from services.ingest import endpoints_sql

WEBHOOK_CHANNELS = ("telegram", "alertmanager", "gitea", "line")
MAX_GRACE_SECONDS = 30 * 24 * 3600.0
MAX_SECRET = 256  # Telegram's secret_token limit; LINE channel secrets are 32 hex characters


def new_secret() -> str:
    """256 random bits in the alphabet every provider accepts (Telegram: A-Z a-z 0-9 _ -)."""
    return secrets.token_urlsafe(32)


def path_of(project_id: str, channel: str, name: str) -> str:
    return f"/v1/webhooks/{project_id}/{channel}/{name}"


@dataclass(frozen=True, slots=True)
class EndpointRow:
    project_id: str
    channel: str
    name: str
    created_at: dt.datetime
    rotated_at: dt.datetime | None
    previous_expires_at: dt.datetime | None


def _row(
    r: endpoints_sql.CreateEndpointRow | endpoints_sql.ListEndpointsRow | endpoints_sql.RotateEndpointRow,
) -> EndpointRow:
    return EndpointRow(
        r["project_id"], r["channel_type"], r["name"], r["created_at"], r["rotated_at"], r["previous_expires_at"]
    )


async def create(
    db: asyncpg.Pool, project_id: str, channel: str, name: str, secret: str, created_by: str
) -> EndpointRow | None:
    """The new endpoint, or None when one of that name exists."""
    r = await endpoints_sql.create_endpoint(
        db, project_id=project_id, channel=channel, name=name, secret=secret, created_by=created_by
    )
    return None if r is None else _row(r)


async def list_all(db: asyncpg.Pool, project_id: str) -> list[EndpointRow]:
    return [_row(r) for r in await endpoints_sql.list_endpoints(db, project_id=project_id)]


async def rotate(
    db: asyncpg.Pool, project_id: str, channel: str, name: str, secret: str, grace: float
) -> EndpointRow | None:
    r = await endpoints_sql.rotate_endpoint(
        db, project_id=project_id, channel=channel, name=name, secret=secret, grace=float(grace)
    )
    return None if r is None else _row(r)


async def remove(db: asyncpg.Pool, project_id: str, channel: str, name: str) -> bool:
    status = await endpoints_sql.remove_endpoint(db, project_id=project_id, channel=channel, name=name)
    return not status.endswith(" 0")


@dataclass(frozen=True, slots=True)
class Secrets:
    """The secrets an endpoint accepts; `previous` only until previous_until (time.monotonic())."""

    current: str
    previous: str | None
    previous_until: float

    def valid_now(self) -> tuple[str, ...]:
        if self.previous is not None and time.monotonic() < self.previous_until:
            return (self.current, self.previous)
        return (self.current,)


class Directory:
    """Endpoint secrets, read through a short cache (AWOOOP_ENDPOINT_CACHE_SECONDS) so a busy
    endpoint costs no store query per delivery. A delivery that fails verification against the
    cached secrets is checked once more against the store, so a rotation is honoured at once;
    a removal takes effect within the cache period."""

    def __init__(self, pool: asyncpg.Pool, cache_seconds: float) -> None:
        self.pool = pool
        self.cache_seconds = cache_seconds
        self._cache: dict[tuple[str, str, str], tuple[float, Secrets | None]] = {}

    async def get(self, project_id: str, channel: str, name: str, *, fresh: bool = False) -> Secrets | None:
        key = (project_id, channel, name)
        now = time.monotonic()
        hit = self._cache.get(key)
        if not fresh and hit is not None and hit[0] > now:
            return hit[1]
        r = await endpoints_sql.endpoint_secrets(self.pool, project_id=project_id, channel=channel, name=name)
        found = None
        if r is not None:
            left = r["previous_left"] or 0.0
            found = Secrets(r["secret"], r["previous_secret"], now + left)
        if len(self._cache) > 10000:
            self._cache.clear()
        self._cache[key] = (now + self.cache_seconds, found)
        return found

    def forget(self, project_id: str, channel: str, name: str) -> None:
        """Called by this process's own rotate/remove, which then take effect here at once."""
        self._cache.pop((project_id, channel, name), None)
