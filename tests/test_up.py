"""`awooop up` as a real process: on an embedded Postgres and Redis kept in a data dir (and
again on the same dir, which must keep the store and the key), and on a configured store.
The commands it prints are pasted into a new terminal (the venv not on PATH) as printed, after the
export lines it says to paste first; the env file it writes gives `source` the same values; its log
keeps the banner in view (no line per RPC or per migration at INFO, no warnings); a durable wait's
callback URL is absolute and completes the wait."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import urllib.request
import uuid
from pathlib import Path

import aiohttp
import asyncpg
import grpc
import pytest
from google.protobuf.duration_pb2 import Duration

from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from tests.harness.helpers import ROOT, eventually
from tests.harness.up import SERVICES, Up, fresh_terminal_env, start_up


async def check_printed_commands(up: Up) -> None:
    """Runs the printed grpcurl lines as pasted in a new terminal (the venv not on PATH) after the
    banner's export lines; the call must authenticate, and `awooop admin` reads the exported store."""
    listing, call, demo = up.try_commands()
    assert demo.startswith("awooop demo")
    assert listing.startswith("grpcurl ") and call.startswith("grpcurl ")
    out = await up.paste(listing)
    assert out.returncode == 0, out.stderr
    assert SERVICES["ingest"] in out.stdout.split()
    out = await up.paste("awooop admin list --json")
    assert out.returncode == 0, out.stderr
    assert "dev-admin" in {p["principal_id"] for p in json.loads(out.stdout)["principals"]}
    out = await up.paste(call)
    for refused in ("Unauthenticated", "Unavailable", "PermissionDenied", "Internal"):
        assert f"Code: {refused}" not in out.stderr, out.stderr
    if out.returncode == 0:  # the ingest RPCs are implemented: a run came back
        assert json.loads(out.stdout)["outcomes"][0]["run_id"]
    else:  # until they are
        assert "Code: Unimplemented" in out.stderr, out.stderr
    # every service of the suite, with reflection, on its port
    for name, full in SERVICES.items():
        out = await up.paste(f"grpcurl -plaintext 127.0.0.1:{up.ports[name]} list")
        assert out.returncode == 0 and full in out.stdout.split(), out.stderr


async def check_the_run_stream_relays_to_its_own_scheduler(up: Up, db: asyncpg.Connection) -> None:
    """Issue 41, item 4: with every port moved (start_up), ingest's HTTP run stream relays to this
    suite's scheduler: it answered 503 (nothing on 50052), or sent the caller's key to whatever
    listened there."""
    run_id = await db.fetchval("SELECT run_id FROM awooop_run_state ORDER BY created_at LIMIT 1")
    assert run_id is not None, "check_printed_commands created no run"
    url = f"http://127.0.0.1:{up.ports['http']}/v1/runs/{run_id}/events"
    async with (
        aiohttp.ClientSession() as http,
        http.get(url, headers={"Authorization": f"Bearer {up.key}"}) as resp,
    ):
        assert resp.status == 200, await resp.text()
        first = await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 30)
    assert b"event: state" in first, first


def shell_values(lines: list[str], names: list[str]) -> dict[str, str]:
    """The values of names in a new terminal after these lines (quotes removed, $PATH expanded)."""
    script = "\n".join([*lines, *(f'printf "%s\\n" "${name}"' for name in names)])
    out = subprocess.run(
        ["bash", "-c", script], env=fresh_terminal_env(), cwd=ROOT, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0 and not out.stderr, out.stderr
    return dict(zip(names, out.stdout.splitlines(), strict=True))


def check_env_file(up: Up, data_dir: Path) -> None:
    """Issue 44, item 7: the banner's export lines are also a file `source` takes, named in the
    banner, holding the values the banner printed (and readable by its owner alone: it has the key)."""
    env_file = data_dir / "up.env"
    assert oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert f"or run: source {env_file}:" in up.out()
    names = sorted(line.removeprefix("export ").split("=", 1)[0] for line in up.exports())
    assert {"PATH", "AWOOOP_API_KEY", "AWOOOP_DATABASE_URL", "AWOOOP_INGEST_PORT"} <= set(names)
    sourced = shell_values([f"source {env_file}"], names)
    assert sourced == shell_values(up.exports(), names)
    assert sourced["AWOOOP_API_KEY"] == up.key


def check_quiet_log(up: Up) -> None:
    """Issue 44, item 7: after start-up and the RPCs the checks made, nothing at INFO is about one
    RPC or one migration, the saga's key probe of the gateway is not in the log, and no warning."""
    records = [json.loads(line) for line in up.err().splitlines() if line.startswith("{")]
    assert records, up.err()
    loud = [r for r in records if r["level"] != "debug"]
    assert not [r for r in loud if r["logger"] == "awooop.rpc"], "an RPC logged at INFO"
    assert not [r for r in loud if r.get("msg") == "applied migration"], "a migration logged by name at INFO"
    assert "INVALID_ARGUMENT" not in up.err()
    assert not [r for r in records if r["level"] in ("warning", "error")], [r for r in records if r["level"] != "info"]
    assert not [line for line in up.err().splitlines() if not line.startswith("{")], up.err()  # no warnings module
    assert len(loud) < 20, [r["msg"] for r in loud]


async def check_callback_url_completes_its_wait(up: Up) -> None:
    """Issue 44, item 3: under `awooop up` a durable wait's callback URL starts with ingest's HTTP
    address (printed in the banner), and a POST to it, as printed, completes the wait."""
    base = up.banner_value(r"^  callbacks  (\S+)/v1/waits/\.\.\. ")
    assert base == f"http://127.0.0.1:{up.ports['http']}"
    md = (("authorization", f"Bearer {up.key}"),)
    project = f"cb-{uuid.uuid4().hex[:8]}"  # the only run a claim there can take
    async with (
        grpc.aio.insecure_channel(f"127.0.0.1:{up.ports['ingest']}") as ing,
        grpc.aio.insecure_channel(f"127.0.0.1:{up.ports['scheduler']}") as sch,
    ):
        ingest = ingest_pb2_grpc.IngestServiceStub(ing)
        sched = scheduler_pb2_grpc.SchedulerServiceStub(sch)
        await ingest.CreateRun(ingest_pb2.CreateRunRequest(project_id=project, idempotency_key="cb"), metadata=md)
        claim = scheduler_pb2.ClaimRunsRequest(
            worker_id="w", project_ids=[project], max_runs=1, wait=Duration(seconds=5)
        )
        (claimed,) = (await sched.ClaimRuns(claim, metadata=md, timeout=30)).runs
        create = scheduler_pb2.CreateWaitRequest(lease=claimed.lease, step_id="deploy", timeout=Duration(seconds=600))
        created = await sched.CreateWait(create, metadata=md)
        assert created.callback_url == f"{base}/v1/waits/{created.token}"
        async with aiohttp.ClientSession() as http, http.post(created.callback_url, json={"build": "green"}) as resp:
            assert resp.status == 200, await resp.text()
        waits = (await sched.ListWaits(scheduler_pb2.ListWaitsRequest(run_id=claimed.lease.run_id), metadata=md)).waits
    assert [w.status for w in waits] == [scheduler_pb2.WAIT_STATUS_COMPLETED]


def port_open(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False


async def test_up_on_an_embedded_store_then_again_on_the_same_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    first = await start_up(data_dir, tmp_path)
    try:
        assert "postgres   embedded" in first.out()
        assert re.search(r"\(applied \d+ migrations \(0001\.\.\d{4}\)\)$", first.out(), re.MULTILINE), first.out()
        assert "redis      embedded, redis://127.0.0.1:" in first.out()
        key = first.key
        assert (data_dir / "dev-admin.key").read_text().strip() == key
        assert oct((data_dir / "dev-admin.key").stat().st_mode & 0o777) == "0o600"
        await check_printed_commands(first)
        check_env_file(first, data_dir)
        check_quiet_log(first)
        # the console is part of the suite: its URL is in the banner and it answers
        console = first.banner_value(r"^  console    (http://127\.0\.0\.1:\d+) ")
        with await asyncio.to_thread(urllib.request.urlopen, f"{console}/signin", timeout=10) as resp:
            assert resp.status == 200 and "Sign in" in resp.read().decode()
        # something to find again: a principal made with the admin CLI on the printed store address
        out = await first.paste(f"awooop admin --database-url '{first.dsn}' create-principal kept-across-restarts")
        assert out.returncode == 0, out.stderr
        redis_port = int(first.banner_value(r"redis://127\.0\.0\.1:(\d+)/"))
        internal_key = (data_dir / "internal-api-key").read_text()
    finally:
        code = await first.stop()
    assert code == 0, first.err()
    assert not (data_dir / "postgres" / "postmaster.pid").exists(), "the embedded Postgres was left running"
    assert not port_open(redis_port), "the embedded Redis was left running"

    second = await start_up(data_dir, tmp_path)
    try:
        assert second.key == key  # the same dev key, still valid
        assert (data_dir / "internal-api-key").read_text() == internal_key  # and the same internal key
        assert "schema up to date" in second.out()
        out = await second.paste(f"awooop admin --database-url '{second.dsn}' list --json")
        assert "kept-across-restarts" in {p["principal_id"] for p in json.loads(out.stdout)["principals"]}, out.stderr
        await check_printed_commands(second)
    finally:
        code = await second.stop()
    assert code == 0, second.err()


async def test_up_on_a_configured_store(db_dsn: str, redis_url: str, db: asyncpg.Connection, tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    up = await start_up(
        data_dir,
        tmp_path,
        AWOOOP_DATABASE_URL=db_dsn,
        AWOOOP_REDIS_URL=redis_url,
        # a prefix of its own: the printed event's dedupe key must not meet an earlier session's
        AWOOOP_REDIS_PREFIX=f"awooop:up-{uuid.uuid4().hex}:",
    )
    try:
        assert "postgres   configured (schema up to date)" in up.out()
        assert f"redis      configured, {redis_url}" in up.out()
        assert not (data_dir / "postgres").exists() and not (data_dir / "redis").exists()
        key_id = up.key.split("_")[1]
        owner = await db.fetchval("SELECT principal_id FROM awooop_api_key WHERE key_id = $1", key_id)
        assert owner == "dev-admin"
        await check_printed_commands(up)
        # the saga's key at the gateway: an internal service key kept in the data dir, accepted
        internal = data_dir / "internal-api-key"
        assert oct(internal.stat().st_mode & 0o777) == "0o600"
        owner = await db.fetchval(
            "SELECT principal_id FROM awooop_api_key WHERE key_id = $1", internal.read_text().split("_")[1]
        )
        assert owner == "awooop-internal"

        async def accepted() -> bool:
            return "accepts AWOOOP_INTERNAL_API_KEY" in up.err()

        await eventually(accepted, timeout=30, what="the gateway to accept the saga's key")
        assert "compensation is stopped" not in up.err()
        await check_the_run_stream_relays_to_its_own_scheduler(up, db)
        await check_callback_url_completes_its_wait(up)
        check_env_file(up, data_dir)
        check_quiet_log(up)
        out = await up.paste(f"awooop health 127.0.0.1:{up.ports['saga']} --service saga")
        assert out.returncode == 0 and "SERVING" in out.stdout, out.stdout + out.stderr
    finally:
        code = await up.stop()
    assert code == 0, up.err()


@pytest.mark.parametrize("host", ["0.0.0.0"])
async def test_banner_dials_a_local_address_when_bound_to_all(host: str) -> None:
    from services.cli.server import banner
    from services.common.settings import Settings

    text = banner(
        Settings(host=host, database_url="postgresql://u:pw@db/x"),
        "awk_a_b",
        store="configured",
        redis="-",
        migrated=[],
    )
    assert "0.0.0.0" not in text and "grpcurl -plaintext 127.0.0.1:50051 list" in text
    assert "pw" not in text and "postgresql://u:***@db/x" in text
