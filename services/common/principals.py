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

ROLES = ("ingest", "worker", "approver", "admin")
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
    await conn.execute(
        """INSERT INTO awooop_principal (principal_id, principal_type, display_name)
           VALUES ($1, $2, $3)
           ON CONFLICT (principal_id) DO UPDATE SET display_name = EXCLUDED.display_name""",
        principal_id,
        principal_type,
        display_name,
    )


async def issue_key(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, label: str = "") -> IssuedKey:
    key_id = secrets.token_hex(8)
    secret = secrets.token_urlsafe(32).replace("_", "-")
    status = await conn.execute(
        """INSERT INTO awooop_api_key (key_id, principal_id, secret_sha256, label)
           SELECT $1, principal_id, $3, $4 FROM awooop_principal WHERE principal_id = $2""",
        key_id,
        principal_id,
        hash_secret(secret),
        label,
    )
    if status.endswith(" 0"):
        raise LookupError(f"principal {principal_id} does not exist")
    return IssuedKey(key_id, f"awk_{key_id}_{secret}")


async def revoke_key(conn: asyncpg.Connection | asyncpg.Pool, key_id: str) -> bool:
    status = await conn.execute(
        "UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1 AND revoked_at IS NULL", key_id
    )
    return not status.endswith(" 0")


async def grant_role(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, project_id: str, role: str) -> None:
    if role not in ROLES:
        raise ValueError(f"role must be one of {ROLES}")
    try:
        await conn.execute(
            """INSERT INTO awooop_project_member (project_id, principal_id, role) VALUES ($1, $2, $3)
               ON CONFLICT DO NOTHING""",
            project_id,
            principal_id,
            role,
        )
    except asyncpg.ForeignKeyViolationError:
        raise LookupError(f"principal {principal_id} does not exist") from None


async def revoke_role(
    conn: asyncpg.Connection | asyncpg.Pool, principal_id: str, project_id: str, role: str | None = None
) -> int:
    """Removes one role, or every role when role is None; returns rows removed."""
    status = await conn.execute(
        """DELETE FROM awooop_project_member
            WHERE principal_id = $1 AND project_id = $2 AND ($3::text IS NULL OR role = $3)""",
        principal_id,
        project_id,
        role,
    )
    return int(status.split()[-1])


async def list_principals(conn: asyncpg.Connection | asyncpg.Pool) -> list[asyncpg.Record]:
    return await conn.fetch(
        """SELECT p.principal_id, p.principal_type, p.display_name,
                  COALESCE(array_agg(m.project_id || ':' || m.role ORDER BY m.project_id, m.role)
                           FILTER (WHERE m.role IS NOT NULL), '{}') AS roles,
                  (SELECT count(*) FROM awooop_api_key k
                    WHERE k.principal_id = p.principal_id AND k.revoked_at IS NULL) AS active_keys
             FROM awooop_principal p
             LEFT JOIN awooop_project_member m USING (principal_id)
            GROUP BY p.principal_id ORDER BY p.principal_id"""
    )


async def bootstrap_admin(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str = "dev-admin") -> IssuedKey:
    """A principal with the admin role in every project, and a fresh key for it."""
    await create_principal(conn, principal_id, "user", "development administrator")
    await grant_role(conn, principal_id, ALL_PROJECTS, "admin")
    return await issue_key(conn, principal_id, "bootstrap")


async def list_keys(conn: asyncpg.Connection | asyncpg.Pool, principal_id: str | None = None) -> list[asyncpg.Record]:
    """Key ids with label and dates (never a secret), newest first; one principal's or all."""
    return await conn.fetch(
        """SELECT key_id, principal_id, label, created_at, revoked_at FROM awooop_api_key
            WHERE $1::text IS NULL OR principal_id = $1
            ORDER BY created_at DESC, key_id""",
        principal_id,
    )


# The internal service principal: the saga presents its key to the tool gateway (which needs a
# role in the run's project) and the scheduler to the saga (Compensate needs admin), so it is
# admin in every project.
INTERNAL_PRINCIPAL = "awooop-internal"
INTERNAL_ROLE = "admin"
# $1 key_id, $2 sha256(secret), $3 principal, $4 role: the key is live, and its principal still
# holds the role in every project
SERVICE_KEY_VALID_SQL = """
SELECT EXISTS (
    SELECT 1 FROM awooop_api_key k
      JOIN awooop_project_member m ON m.principal_id = k.principal_id
     WHERE k.key_id = $1 AND k.secret_sha256 = $2 AND k.revoked_at IS NULL
       AND k.principal_id = $3 AND m.project_id = '*' AND m.role = $4)
"""


async def service_key_valid(conn: asyncpg.Connection, key: str, principal_id: str = INTERNAL_PRINCIPAL) -> bool:
    parsed = parse_key(key)
    if parsed is None:
        return False
    key_id, secret = parsed
    return bool(await conn.fetchval(SERVICE_KEY_VALID_SQL, key_id, hash_secret(secret), principal_id, INTERNAL_ROLE))


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
