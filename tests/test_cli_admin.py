"""`awooop admin` as real processes against this test's database; the keys it issues are
used against a real server, and refused there once revoked."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import asyncpg
import grpc

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from services.common.auth import Authenticator
from tests.harness.helpers import ROOT, expect_error

KEY_RE = re.compile(r"^awk_([0-9a-f]{16})_([A-Za-z0-9-]{43})$")


async def awooop(*args: str, dsn: str | None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    if dsn is not None:
        env["AWOOOP_DATABASE_URL"] = dsn
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "awooop.cli", *args],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def test_principal_key_and_role_lifecycle(db_dsn: str, db: asyncpg.Connection, start_services, channels) -> None:
    async def admin(*args: str) -> subprocess.CompletedProcess[str]:
        out = await awooop("admin", *args, dsn=db_dsn)
        assert out.returncode == 0, out.stderr
        return out

    await admin("create-principal", "ci-bot", "--type", "service", "--name", "CI")
    await admin("create-principal", "ci-bot", "--type", "service", "--name", "CI bot")  # renames, no error
    await admin("grant", "ci-bot", "proj-a", "worker")
    await admin("grant", "ci-bot", "proj-b", "ingest")
    await admin("grant", "ci-bot", "proj-b", "ingest")  # granting twice is harmless
    issued = await admin("issue-key", "ci-bot", "--label", "ci")
    key = issued.stdout.strip()
    m = KEY_RE.match(key)
    assert m, f"stdout must be the key alone: {issued.stdout!r}"
    key_id, secret = m.groups()

    listed = json.loads((await admin("list", "--json")).stdout)["principals"]
    bot = next(p for p in listed if p["principal_id"] == "ci-bot")
    assert bot["principal_type"] == "service" and bot["display_name"] == "CI bot"
    assert bot["roles"] == ["proj-a:worker", "proj-b:ingest"] and bot["active_keys"] == 1

    # stored hashed: the row holds sha256(secret), and the secret appears nowhere in it
    row = await db.fetchrow("SELECT * FROM awooop_api_key WHERE key_id = $1", key_id)
    assert row["secret_sha256"] == hashlib.sha256(secret.encode()).digest()
    assert secret not in repr(dict(row))
    keys = await admin("list-keys", "ci-bot")
    assert key_id in keys.stdout and secret not in keys.stdout

    # what a server sees for this key: its roles, fresh from the store
    pool = await asyncpg.create_pool(db_dsn, min_size=1, max_size=2)
    try:
        auth = Authenticator(pool, 0)
        p = await auth.authenticate(f"Bearer {key}")
        assert p.principal_id == "ci-bot" and p.has("proj-a", "worker") and p.has("proj-b", "ingest")
        assert not p.has("proj-a", "admin") and not p.has("proj-c", "worker")
        await admin("revoke", "ci-bot", "proj-a", "worker")
        p = await auth.authenticate(f"Bearer {key}")
        assert not p.has("proj-a", "worker") and p.has("proj-b", "ingest")
        await admin("revoke", "ci-bot", "proj-b")  # every role in proj-b
        assert (await auth.authenticate(f"Bearer {key}")).roles == {}
    finally:
        await pool.close()

    # the key authenticates against a real server, and is refused there after revoke-key
    rt = await start_services("ingest", auth_cache_seconds=0)
    stub = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    md = (("authorization", f"Bearer {key}"),)
    req = ingest_pb2.CreateRunRequest(project_id="proj-b", idempotency_key="k1")
    try:
        await stub.CreateRun(req, metadata=md)
    except grpc.aio.AioRpcError as err:
        # authenticated: refused for its (now empty) roles, or UNIMPLEMENTED until ingest lands
        assert err.code() in (grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.UNIMPLEMENTED), err
    await admin("revoke-key", key_id)
    await expect_error(stub.CreateRun(req, metadata=md), grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    assert json.loads((await admin("list", "--json")).stdout)["principals"][0]["active_keys"] == 0

    # a second key can be revoked by pasting the whole key
    second = (await admin("issue-key", "ci-bot")).stdout.strip()
    await admin("revoke-key", second)
    assert await db.fetchval("SELECT count(*) FROM awooop_api_key WHERE revoked_at IS NULL") == 0


async def test_refusals_are_clear_and_change_nothing(db_dsn: str, db: asyncpg.Connection) -> None:
    out = await awooop("admin", "grant", "ghost", "proj", "worker", dsn=db_dsn)
    assert out.returncode == 1 and "principal ghost does not exist" in out.stderr
    out = await awooop("admin", "issue-key", "ghost", dsn=db_dsn)
    assert out.returncode == 1 and "principal ghost does not exist" in out.stderr and out.stdout == ""
    out = await awooop("admin", "revoke-key", "0123456789abcdef", dsn=db_dsn)
    assert out.returncode == 1 and "not found or already revoked" in out.stderr
    out = await awooop("admin", "revoke", "ghost", "proj", dsn=db_dsn)
    assert out.returncode == 1 and "has no role in proj" in out.stderr
    out = await awooop("admin", "grant", "ghost", "not a project!", "worker", dsn=db_dsn)
    assert out.returncode == 2 and "argument project_id" in out.stderr
    out = await awooop("admin", "grant", "ghost", "proj", "superuser", dsn=db_dsn)
    assert out.returncode == 2 and "invalid choice" in out.stderr
    out = await awooop("admin", "create-principal", "x" * 129, dsn=db_dsn)
    assert out.returncode == 2 and "argument principal_id" in out.stderr
    assert await db.fetchval("SELECT count(*) FROM awooop_principal") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_project_member") == 0

    out = await awooop("admin", "list", dsn=None)
    assert out.returncode == 2 and "AWOOOP_DATABASE_URL is not set" in out.stderr
    out = await awooop("admin", "--database-url", "postgresql://nobody@127.0.0.1:1/none", "list", dsn=None)
    assert out.returncode == 1 and "cannot reach the store" in out.stderr


async def test_ensure_service_key_keeps_a_valid_key_and_refuses_a_file_it_cannot_write(
    db_dsn: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    path = tmp_path / "internal-api-key"
    first = await awooop("admin", "ensure-service-key", "--file", str(path), dsn=db_dsn)
    assert first.returncode == 0 and first.stdout == "", first.stderr  # the key only in the file
    key = path.read_text().strip()
    assert KEY_RE.match(key) and oct(path.stat().st_mode & 0o777) == "0o600"
    kept = await awooop("admin", "ensure-service-key", "--file", str(path), dsn=db_dsn)
    assert kept.returncode == 0 and "kept" in kept.stderr and path.read_text().strip() == key
    assert await db.fetchval("SELECT count(*) FROM awooop_api_key WHERE principal_id = 'awooop-internal'") == 1

    nowhere = tmp_path / "missing-dir" / "internal-api-key"
    out = await awooop("admin", "ensure-service-key", "--file", str(nowhere), "--principal", "other", dsn=db_dsn)
    assert out.returncode == 1 and out.stderr.startswith(f"error: cannot read or write {nowhere}"), out.stderr
    # refused before anything was issued: no principal, no key left behind unused
    assert await db.fetchval("SELECT count(*) FROM awooop_principal WHERE principal_id = 'other'") == 0
