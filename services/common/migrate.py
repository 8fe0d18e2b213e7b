"""Applies the ordered SQL files in services/common/migrations exactly once each, then creates
the plan functions of this release's hot statements (services/common/server_plans.py), which the
services register under the `awooop.hot_statements` entry points (pyproject.toml): this module
knows no service.

Each file runs in its own transaction together with its row in awooop_schema_migrations;
a session advisory lock makes concurrent `awooop migrate` runs (several replicas starting
with AWOOOP_MIGRATE_ON_START, or two releases during a rolling deploy) wait for each other
instead of racing.
"""

from __future__ import annotations

import hashlib
import itertools
import logging
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import entry_points

import asyncpg

from services.common import migrate_sql, server_plans

log = logging.getLogger("awooop.migrate")

# where a service registers a function listing its hot statements (`statements() -> list[str]`)
HOT_STATEMENTS_GROUP = "awooop.hot_statements"

# pg_advisory_lock key: the first 8 bytes of sha256("awooop-migrate")
LOCK_KEY = int.from_bytes(hashlib.sha256(b"awooop-migrate").digest()[:8], "big", signed=True)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def load() -> list[Migration]:
    out = []
    for entry in resources.files("services.common.migrations").iterdir():
        if entry.name.endswith(".sql"):
            version = int(entry.name.split("_", 1)[0])
            out.append(Migration(version, entry.name, entry.read_text(encoding="utf-8")))
    out.sort(key=lambda m: m.version)
    for a, b in itertools.pairwise(out):
        if a.version == b.version:  # two branches took one number: refuse rather than apply one of them
            raise RuntimeError(f"migrations {a.name} and {b.name} share version {a.version}; renumber one")
    return out


async def apply(conn: asyncpg.Connection) -> list[str]:
    """Applies pending migrations; returns the names applied (empty when up to date)."""
    await migrate_sql.lock_migrations(conn, lock_key=LOCK_KEY)
    try:
        await migrate_sql.create_migrations_table(conn)
        done = {r["version"] for r in await migrate_sql.applied_migrations(conn)}
        applied = []
        for m in load():
            if m.version in done:
                continue
            async with conn.transaction():
                await conn.execute(m.sql)
                await migrate_sql.record_migration(conn, version=m.version, name=m.name)
            log.debug("applied migration", extra={"migration": m.name})
            applied.append(m.name)
        if applied:  # one line, however many: a fresh store has dozens
            log.info(summary(applied))
        await create_plan_functions(conn, verify=bool(applied))
        return applied
    finally:
        await migrate_sql.unlock_migrations(conn, lock_key=LOCK_KEY)


def summary(applied: list[str]) -> str:
    """What a pass of apply() did, in one line: "applied 36 migrations (0001..0290)"."""
    if not applied:
        return "schema up to date"
    first, last = (name.split("_", 1)[0] for name in (applied[0], applied[-1]))
    span = first if len(applied) == 1 else f"{first}..{last}"
    return f"applied {len(applied)} migration{'s' if len(applied) > 1 else ''} ({span})"


def hot_statements() -> list[str]:
    """Every statement that gets a plan function: what each registered service lists, in a stable
    order. None registered means the server package is not installed (its metadata is missing):
    an error, since the services would then run every statement plain behind a pooler."""
    listed = [ep.load() for ep in entry_points(group=HOT_STATEMENTS_GROUP)]
    if not listed:
        raise RuntimeError(f"no {HOT_STATEMENTS_GROUP} entry points: install the server package (pip install awooop)")
    return sorted({statement for statements in listed for statement in statements()})


async def create_plan_functions(conn: asyncpg.Connection, *, verify: bool) -> server_plans.Created:
    """The plan functions of this release's hot statements: those missing are created; with
    verify (migrations were just applied, so types may have changed) the others are checked too.
    A statement no function can be made of is logged and runs plain; the migration succeeds."""
    done = await server_plans.create_functions(conn, hot_statements(), verify=verify)
    if done.created or done.replaced:
        log.info(
            "created plan functions",
            extra={"plan_functions_created": len(done.created), "plan_functions_replaced": len(done.replaced)},
        )
    if done.skipped:  # one line, however many (no CREATE privilege would refuse them all)
        name, why = done.skipped[0]
        log.warning(
            "%d hot statements have no plan function (the first, %s: %s); they run plain behind a pooler",
            len(done.skipped),
            name,
            why,
        )
    return done


async def migrate(dsn: str) -> list[str]:
    conn = await asyncpg.connect(dsn, statement_cache_size=0)  # describing hot statements: unnamed
    try:
        return await apply(conn)
    finally:
        await conn.close()
