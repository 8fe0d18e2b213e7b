"""Principals, API keys and project roles: the store side of docs/architecture.md,
"Security and errors".

Keys look like "awk_<key_id>_<secret>". Only sha256(secret) is stored: the secret is 256
random bits, so a fast hash is enough and lookups stay cheap. Used by `awooop admin`,
`awooop up` and the tests.
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass

import asyncpg

from services.common import principals_sql

ROLES = ("ingest", "worker", "approver", "admin", "tool")
# tool: a tool or external system that posts results (CompleteWait in its project) and nothing
# else: it reads nothing and is no member for the reads every other role may make
TOOL_ROLE = "tool"
MEMBER_ROLES = tuple(r for r in ROLES if r != TOOL_ROLE)
PRINCIPAL_TYPES = ("user", "service")
ALL_PROJECTS = "*"


def hash_secret(secret: str) -> bytes:
    return hashlib.sha256(secret.encode()).digest()


def parse_key(key: str) -> tuple[str, str] | None:
    """(key_id, secret) of a well-formed key, else None. Keys are ASCII (issue_key): anything
    else, such as a header's invalid UTF-8 bytes, is malformed rather than a failure to hash."""
    if not key.isascii():
        return None
    parts = key.split("_")
    if len(parts) != 3 or parts[0] != "awk" or not parts[1] or not parts[2]:
        return None
    return parts[1], parts[2]


@dataclass(frozen=True)
class IssuedKey:
    key_id: str
    key: str  # shown once


async def create_principal(
    conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, principal_type: str = "user", display_name: str = ""
) -> None:
    if principal_type not in PRINCIPAL_TYPES:
        raise ValueError(f"principal_type must be one of {PRINCIPAL_TYPES}")
    await principals_sql.create_principal(
        conn, principal_id=principal_id, principal_type=principal_type, display_name=display_name
    )


async def issue_key(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, label: str = "") -> IssuedKey:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32).replace("_", "-")
    status = await principals_sql.issue_key(
        conn, key_id=key_id, principal_id=principal_id, secret_sha256=hash_secret(secret), label=label
    )
    if status.endswith(" 0"):
        raise LookupError(f"principal {principal_id} does not exist")
    return IssuedKey(key_id, f"awk_{key_id}_{secret}")


async def revoke_key(conn: asyncpg.Connection | asyncpg.Pool, key_id: str) -> bool:
    status = await principals_sql.revoke_key(conn, key_id=key_id)
    return not status.endswith(" 0")


async def grant_role(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, project_id: str, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    try:
        await principals_sql.grant_role(conn, project_id=project_id, principal_id=principal_id, role=role)
    except asyncpg.ForeignKeyViolationError:
        raise LookupError(f"principal {principal_id} does not exist") from None


async def revoke_role(
    conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, project_id: str, role: str | None = None
) -> int:
    """Removes one role, or every role when role is None; returns rows removed."""
    status = await principals_sql.revoke_role(conn, principal_id=principal_id, project_id=project_id, role=role)
    return int(status.split()[-1])


async def list_principals(conn: asyncpg.Connection | asyncpg.Pool) -> list[principals_sql.ListPrincipalsRow]:
    return await principals_sql.list_principals(conn)


async def bootstrap_admin(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str = "dev-admin") -> IssuedKey:
    """A principal with the admin role in every project, and a fresh key for it."""
    await create_principal(conn, principal_id, "user", "development administrator")
    await grant_role(conn, principal_id, ALL_PROJECTS, "admin")
    return await issue_key(conn, principal_id, "bootstrap")


async def list_keys(
    conn: asyncpg.Connection | asyncpg.Pool, principal_id: str | None = None
) -> list[principals_sql.ListKeysRow]:
    """Key ids with label and dates (never a secret), newest first; one principal's or all."""
    return await principals_sql.list_keys(conn, principal_id=principal_id)


# The internal service principal: the saga presents its key to the tool gateway (which needs a
# role in the run's project) and the scheduler to the saga (Compensate needs admin), so it is
# admin in every project.
INTERNAL_PRINCIPAL = "awooop-internal"
INTERNAL_ROLE = "admin"


async def service_key_valid(conn: asyncpg.Connection, key: str, principal_id: str = INTERNAL_PRINCIPAL) -> bool:
    parsed = parse_key(key)
    if parsed is None:
        return False
    key_id, secret = parsed
    return await principals_sql.service_key_valid(
        conn, key_id=key_id, secret_sha256=hash_secret(secret), principal_id=principal_id, role=INTERNAL_ROLE
    )


async def ensure_service_key(
    conn: asyncpg.Connection, current: str | None, principal_id: str = INTERNAL_PRINCIPAL
) -> IssuedKey | None:
    """None when current is a live key of principal_id with its role in every project; else, in
    one transaction, the principal (created if missing) gets that role and a fresh key."""
    if current and await service_key_valid(conn, current, principal_id):
        return None
    async with conn.transaction():
        await create_principal(conn, principal_id, "service", "awooop services (saga -> gateway, scheduler -> saga)")
        await grant_role(conn, principal_id, ALL_PROJECTS, INTERNAL_ROLE)
        return await issue_key(conn, principal_id, "internal service key")
