"""`awooop admin`: principals, API keys and project roles, straight against the store
(AWOOOP_DATABASE_URL). Keys are printed once and stored only as hashes."""

from __future__ import annotations

import argparse
import asyncio
import json
from typing import Any

ROLES = ("ingest", "worker", "approver", "admin")


def register(sub: Any) -> None:
    admin = sub.add_parser("admin", help="manage principals, API keys and project roles")
    admin.add_argument("--database-url", default=None, help="default: AWOOOP_DATABASE_URL")
    a = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)

    p = a.add_parser("create-principal", help="create (or rename) a principal")
    p.add_argument("principal_id")
    p.add_argument("--type", choices=("user", "service"), default="user")
    p.add_argument("--name", default="")
    p.set_defaults(func=_run(_create_principal))

    p = a.add_parser("issue-key", help="issue an API key for a principal (printed once)")
    p.add_argument("principal_id")
    p.add_argument("--label", default="")
    p.set_defaults(func=_run(_issue_key))

    p = a.add_parser("revoke-key", help="revoke an API key by its id (the part after awk_)")
    p.add_argument("key_id")
    p.set_defaults(func=_run(_revoke_key))

    p = a.add_parser("grant", help="grant a role in a project ('*' for every project)")
    p.add_argument("principal_id")
    p.add_argument("project_id")
    p.add_argument("role", choices=ROLES)
    p.set_defaults(func=_run(_grant))

    p = a.add_parser("revoke", help="revoke a role (or every role) in a project")
    p.add_argument("principal_id")
    p.add_argument("project_id")
    p.add_argument("role", nargs="?", choices=ROLES)
    p.set_defaults(func=_run(_revoke))

    p = a.add_parser("list", help="list principals with their roles")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run(_list))


def _run(fn: Any) -> Any:
    def call(args: argparse.Namespace) -> int:
        import asyncpg

        from services.common.settings import Settings

        dsn = args.database_url or Settings.from_env().database_url
        if not dsn:
            print("AWOOOP_DATABASE_URL is not set (or pass --database-url)")
            return 2

        async def go() -> int:
            conn = await asyncpg.connect(dsn)
            try:
                return int(await fn(conn, args) or 0)
            finally:
                await conn.close()

        try:
            return asyncio.run(go())
        except (LookupError, ValueError) as exc:
            print(f"error: {exc}")
            return 1

    return call


async def _create_principal(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    await principals.create_principal(conn, args.principal_id, args.type, args.name)
    print(f"principal {args.principal_id} ({args.type}) ready")
    return 0


async def _issue_key(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    issued = await principals.issue_key(conn, args.principal_id, args.label)
    print(issued.key)
    return 0


async def _revoke_key(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    if await principals.revoke_key(conn, args.key_id):
        print(f"key {args.key_id} revoked")
        return 0
    print(f"key {args.key_id} not found or already revoked")
    return 1


async def _grant(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    await principals.grant_role(conn, args.principal_id, args.project_id, args.role)
    print(f"{args.principal_id} is {args.role} in {args.project_id}")
    return 0


async def _revoke(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    n = await principals.revoke_role(conn, args.principal_id, args.project_id, args.role)
    print(f"{n} role(s) revoked")
    return 0 if n else 1


async def _list(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    rows = await principals.list_principals(conn)
    if args.json:
        print(json.dumps([dict(r) | {"roles": list(r["roles"])} for r in rows], indent=2))
        return 0
    print(f"{'PRINCIPAL':<24} {'TYPE':<8} {'KEYS':>4}  ROLES")
    for r in rows:
        print(f"{r['principal_id']:<24} {r['principal_type']:<8} {r['active_keys']:>4}  {' '.join(r['roles'])}")
    return 0
