"""`awooop admin`: principals, API keys and project roles, straight against the store
(AWOOOP_DATABASE_URL or --database-url). A key is printed once, on stdout alone so scripts
can capture it, and stored only as a hash. Exit codes: 0 done, 1 refused (unknown
principal or key, bad value, store unreachable), 2 not configured."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
from pathlib import Path
from typing import Any

# services.common.principals.ROLES, not imported: loading this module (for every `awooop` command,
# an `awooop.cli_commands` entry point) stays free of the store's libraries
ROLES = ("ingest", "worker", "approver", "admin", "tool")
# the store's column sizes (0001_initial.sql) and the services' project id rule
PRINCIPAL_RE = re.compile(r"^[\x21-\x7e]{1,128}$")
PROJECT_RE = re.compile(r"^(\*|[A-Za-z0-9][A-Za-z0-9._-]{0,63})$")


def _principal_id(value: str) -> str:
    if not PRINCIPAL_RE.match(value):
        raise argparse.ArgumentTypeError("1-128 printable ASCII characters without spaces")
    return value


def _project_id(value: str) -> str:
    if not PROJECT_RE.match(value):
        raise argparse.ArgumentTypeError(
            "'*' (every project) or 1-64 letters, digits, '.', '_', '-' starting with a letter or digit"
        )
    return value


def register(sub: Any) -> None:
    admin = sub.add_parser("admin", help="manage principals, API keys and project roles")
    admin.add_argument("--database-url", default=None, help="default: AWOOOP_DATABASE_URL")
    a = admin.add_subparsers(dest="admin_command", metavar="ACTION", required=True)

    p = a.add_parser("create-principal", help="create (or rename) a principal")
    p.add_argument("principal_id", type=_principal_id)
    p.add_argument("--type", choices=("user", "service"), default="user")
    p.add_argument("--name", default="", help="display name")
    p.set_defaults(func=_run(_create_principal))

    p = a.add_parser("issue-key", help="issue an API key for a principal (printed once)")
    p.add_argument("principal_id", type=_principal_id)
    p.add_argument("--label", default="", help="what the key is for (shown by list-keys)")
    p.set_defaults(func=_run(_issue_key))

    p = a.add_parser("revoke-key", help="revoke an API key by its id (the part between awk_ and the next _)")
    p.add_argument("key_id", help="key id, or the whole key")
    p.set_defaults(func=_run(_revoke_key))

    p = a.add_parser("grant", help="grant a role in a project ('*' for every project)")
    p.add_argument("principal_id", type=_principal_id)
    p.add_argument("project_id", type=_project_id)
    p.add_argument("role", choices=ROLES)
    p.set_defaults(func=_run(_grant))

    p = a.add_parser("revoke", help="revoke a role (or every role) in a project")
    p.add_argument("principal_id", type=_principal_id)
    p.add_argument("project_id", type=_project_id)
    p.add_argument("role", nargs="?", choices=ROLES)
    p.set_defaults(func=_run(_revoke))

    p = a.add_parser(
        "ensure-service-key",
        help="keep a valid internal service key (AWOOOP_INTERNAL_API_KEY) in a file: issued when missing or revoked",
    )
    p.add_argument("--file", required=True, help="where the key is kept (AWOOOP_INTERNAL_API_KEY_FILE); mode 0600")
    p.add_argument("--principal", type=_principal_id, default=None, help="default: awooop-internal (admin in '*')")
    p.set_defaults(func=_run(_ensure_service_key))

    p = a.add_parser("list", help="list principals with their roles and active key count")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run(_list))

    p = a.add_parser("list-keys", help="list key ids (never secrets) of one principal or all")
    p.add_argument("principal_id", nargs="?", type=_principal_id)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=_run(_list_keys))

    # each action takes --database-url too (`admin list --database-url X` = `admin --database-url X list`);
    # SUPPRESS: an action without it leaves the value given before the action alone
    for action in a.choices.values():
        action.add_argument("--database-url", default=argparse.SUPPRESS, help="default: AWOOOP_DATABASE_URL")


def _fail(message: str, code: int = 1) -> int:
    print(f"error: {message}", file=sys.stderr)
    return code


def _run(fn: Any) -> Any:
    def call(args: argparse.Namespace) -> int:
        import asyncpg

        from services.common.settings import Settings, SettingsError

        try:
            dsn = args.database_url or Settings.from_env().direct_url
        except SettingsError as exc:
            return _fail(str(exc), 2)
        if not dsn:
            return _fail("AWOOOP_DATABASE_URL is not set (or pass --database-url)", 2)

        async def go() -> int:
            conn = await asyncpg.connect(dsn, timeout=10)
            try:
                return int(await fn(conn, args) or 0)
            finally:
                await conn.close()

        try:
            return asyncio.run(go())
        except (LookupError, ValueError) as exc:
            return _fail(str(exc))
        except (OSError, TimeoutError, asyncpg.PostgresConnectionError) as exc:
            return _fail(f"cannot reach the store: {exc}")
        except asyncpg.UndefinedTableError:
            return _fail("the store has no awooop schema yet: run `awooop migrate` first")

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
    print(f"key id {issued.key_id}: shown once, stored only as a hash", file=sys.stderr)
    return 0


async def ensure_key_file(conn: Any, path: Path, principal: str) -> tuple[str, str | None]:
    """(the valid internal service key kept in path, the id of a key issued now or None when the
    file's key was kept). The file is replaced whole (written beside it, renamed): a reader never
    sees half a key. Raises OSError when the file cannot be read or written, before any key is
    issued (no orphan key in the store)."""
    from services.common import principals

    current = path.read_text().strip() if path.is_file() else None
    tmp = path.with_name(f".{path.name}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)  # writable? (before issuing)
    with os.fdopen(fd, "w") as f:
        try:
            issued = await principals.ensure_service_key(conn, current, principal)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        if issued is not None:
            f.write(issued.key + "\n")
    if issued is None:
        tmp.unlink(missing_ok=True)
        assert current is not None
        return current, None
    tmp.replace(path)
    return issued.key, issued.key_id


async def _ensure_service_key(conn: Any, args: argparse.Namespace) -> int:
    """Idempotent, for a deployment's one-shot step: the file's key is kept while it is valid."""
    from services.common import principals

    path = Path(args.file)
    principal = args.principal or principals.INTERNAL_PRINCIPAL
    try:
        _, issued = await ensure_key_file(conn, path, principal)
    except OSError as exc:  # checked before any key is issued: nothing is left behind
        return _fail(f"cannot read or write {path}: {exc.strerror}")
    if issued is None:
        print(f"{path}: the key of {principal} is valid; kept", file=sys.stderr)
    else:
        print(f"{path}: issued key {issued} for {principal} (admin in every project)", file=sys.stderr)
    return 0


async def _revoke_key(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    parsed = principals.parse_key(args.key_id)
    key_id = parsed[0] if parsed else args.key_id
    if await principals.revoke_key(conn, key_id):
        print(f"key {key_id} revoked")
        return 0
    return _fail(f"key {key_id} not found or already revoked")


async def _grant(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    await principals.grant_role(conn, args.principal_id, args.project_id, args.role)
    print(f"{args.principal_id} is {args.role} in {args.project_id}")
    return 0


async def _revoke(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    n = await principals.revoke_role(conn, args.principal_id, args.project_id, args.role)
    if not n:
        return _fail(f"{args.principal_id} has no {args.role or 'role'} in {args.project_id}")
    print(f"{n} role(s) revoked")
    return 0


async def _list(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    rows = await principals.list_principals(conn)
    if args.json:
        listed = [
            {
                "principal_id": r["principal_id"],
                "principal_type": r["principal_type"],
                "display_name": r["display_name"],
                "roles": r["roles"],
                "active_keys": r["active_keys"],
            }
            for r in rows
        ]
        print(json.dumps({"principals": listed}, indent=2))
        return 0
    print(f"{'PRINCIPAL':<24} {'TYPE':<8} {'KEYS':>4}  ROLES")
    for r in rows:
        print(f"{r['principal_id']:<24} {r['principal_type']:<8} {r['active_keys']:>4}  {' '.join(r['roles'])}")
    return 0


async def _list_keys(conn: Any, args: argparse.Namespace) -> int:
    from services.common import principals

    rows = await principals.list_keys(conn, args.principal_id)
    if args.json:
        keys = [
            {
                "key_id": r["key_id"],
                "principal_id": r["principal_id"],
                "label": r["label"],
                "created_at": r["created_at"],
                "revoked_at": r["revoked_at"],
            }
            for r in rows
        ]
        print(json.dumps({"keys": keys}, indent=2, default=str))
        return 0
    print(f"{'KEY ID':<18} {'PRINCIPAL':<24} {'CREATED':<20} {'REVOKED':<20} LABEL")
    for r in rows:
        revoked = r["revoked_at"].strftime("%Y-%m-%d %H:%M:%S") if r["revoked_at"] else "-"
        created = r["created_at"].strftime("%Y-%m-%d %H:%M:%S")
        print(f"{r['key_id']:<18} {r['principal_id']:<24} {created:<20} {revoked:<20} {r['label']}")
    return 0
