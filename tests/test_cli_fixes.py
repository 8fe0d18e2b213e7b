"""The CLI as a new user meets it, each case a real `awooop` process: a port clash is one line naming
the port and the setting before anything starts; the CLI dials AWOOOP_*_PORT; UNAVAILABLE says
which flag or variable sets the address; `--limit` below 1 is refused; connection flags go before
or after the action; `runs show` works with any role; errors say their code once; `--tls` against
a plaintext server says so; a host name that does not resolve, another service's port and a
pipe closed early (`awooop config | head`) are one plain line or nothing."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from services.common.embedded import free_port

PROJECT = "clifix"


async def awooop(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | env
    return await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "awooop.cli", *args],
        env=full,
        capture_output=True,
        text=True,
        timeout=60,
    )


async def new_run(db: Any) -> str:
    return str(
        await db.fetchval(
            "INSERT INTO awooop_run_state (project_id, channel_type) VALUES ($1, 'api') RETURNING run_id", PROJECT
        )
    )


async def test_up_with_the_metrics_port_taken_is_one_line_before_anything_starts(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        ports = {f"AWOOOP_{s}_PORT": str(free_port()) for s in ("INGEST", "SCHEDULER", "SAGA", "GATEWAY")}
        out = await awooop("up", "--data-dir", str(tmp_path / "data"), AWOOOP_METRICS_PORT=str(port), **ports)
    assert out.returncode == 1, out
    assert out.stderr.strip() == f"error: port {port} on 127.0.0.1 is in use: set AWOOOP_METRICS_PORT to a free port"
    assert "Traceback" not in out.stderr
    # nothing was started: no embedded Postgres or Redis was created
    assert not (tmp_path / "data" / "postgres").exists() and not (tmp_path / "data" / "redis").exists()


async def test_up_with_one_port_set_twice_names_both_settings(tmp_path: Path) -> None:
    port = str(free_port())
    out = await awooop(
        "up",
        "--data-dir",
        str(tmp_path / "data"),
        AWOOOP_INGEST_PORT=str(free_port()),
        AWOOOP_SCHEDULER_PORT=port,
        AWOOOP_SAGA_PORT=port,
        AWOOOP_GATEWAY_PORT=str(free_port()),
        AWOOOP_METRICS_PORT="0",
    )
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"error: port {port} is configured twice (AWOOOP_SCHEDULER_PORT and AWOOOP_SAGA_PORT): change one of them"
    )
    assert not (tmp_path / "data" / "postgres").exists()


async def test_serve_with_a_grpc_port_taken_names_its_setting(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        out = await awooop(
            "serve",
            "saga",
            AWOOOP_DATABASE_URL="postgresql://nobody@127.0.0.1:1/none",
            AWOOOP_SAGA_PORT=str(port),
            AWOOOP_METRICS_PORT="0",
        )
    assert out.returncode == 1
    assert out.stderr.strip().splitlines()[-1] == (
        f"port {port} on 127.0.0.1 is in use: set AWOOOP_SAGA_PORT to a free port"
    ), out.stderr
    assert "Traceback" not in out.stderr


@pytest.fixture
async def served(start_services: Any, make_key: Any) -> tuple[Any, str, str]:
    rt = await start_services("scheduler", "saga")
    admin = (await make_key("cli-admin", {PROJECT: ["admin"]}))[0][1].removeprefix("Bearer ")
    ingest_only = (await make_key("cli-ingest", {PROJECT: ["ingest"]}))[0][1].removeprefix("Bearer ")
    return rt, admin, ingest_only


async def test_runs_show_dials_the_configured_ports_and_works_with_the_ingest_role(served: Any, db: Any) -> None:
    rt, _, ingest_only = served
    run_id = await new_run(db)
    out = await awooop(
        "runs",
        "show",
        run_id,
        AWOOOP_API_KEY=ingest_only,
        AWOOOP_SCHEDULER_PORT=str(rt.ports["scheduler"]),
        AWOOOP_SAGA_PORT=str(rt.ports["saga"]),
    )
    assert out.returncode == 0, out.stderr
    assert run_id in out.stdout and "journal (saga" in out.stdout and out.stderr == ""


async def test_unavailable_says_which_flag_or_variable_sets_the_address(served: Any) -> None:
    _, admin, _ = served
    closed = free_port()
    out = await awooop("runs", "list", "--project", PROJECT, AWOOOP_API_KEY=admin, AWOOOP_SCHEDULER_PORT=str(closed))
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"error: UNAVAILABLE: cannot reach the scheduler at 127.0.0.1:{closed} (Connection refused); "
        "that address is from AWOOOP_SCHEDULER_PORT: set it with --scheduler or AWOOOP_SCHEDULER_ADDR"
    )
    out = await awooop("runs", "list", "--project", PROJECT, "--scheduler", f"127.0.0.1:{closed}", AWOOOP_API_KEY=admin)
    assert "that address is from --scheduler: set it with --scheduler or AWOOOP_SCHEDULER_ADDR" in out.stderr


async def test_tls_against_a_plaintext_server_says_so(served: Any, db: Any) -> None:
    rt, admin, _ = served
    run_id = await new_run(db)
    addr = f"127.0.0.1:{rt.ports['scheduler']}"
    out = await awooop("runs", "show", run_id, "--tls", "--scheduler", addr, AWOOOP_API_KEY=admin)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"error: UNAVAILABLE: the scheduler at {addr} does not speak TLS (the TLS handshake failed):"
        " drop --tls / AWOOOP_TLS, or point at a TLS port"
    ), out.stderr


@pytest.mark.parametrize("limit", ["0", "-1"])
async def test_runs_list_refuses_a_limit_below_one(limit: str) -> None:
    out = await awooop("runs", "list", "--project", PROJECT, "--limit", limit)
    assert out.returncode == 2 and f"argument --limit: must be at least 1, got {limit}" in out.stderr


async def test_connection_flags_go_before_or_after_the_action(served: Any, db: Any, db_dsn: str) -> None:
    rt, admin, _ = served
    run_id = await new_run(db)
    addr = f"127.0.0.1:{rt.ports['scheduler']}"
    after = await awooop("runs", "list", "--project", PROJECT, "--scheduler", addr, "--key", admin)
    before = await awooop("runs", "--scheduler", addr, "--key", admin, "list", "--project", PROJECT)
    assert after.returncode == 0 and before.returncode == 0, (after.stderr, before.stderr)
    assert run_id in after.stdout and run_id in before.stdout
    # compensation actions are one level deeper
    out = await awooop(
        "runs", "--scheduler", addr, "--saga", "127.0.0.1:1", "compensation", "retry", run_id, "--key", admin
    )
    assert "cannot reach the saga at 127.0.0.1:1" in out.stderr, out.stderr

    for argv in (["admin", "list", "--database-url", db_dsn], ["admin", "--database-url", db_dsn, "list"]):
        out = await awooop(*argv)
        assert out.returncode == 0 and "cli-admin" in out.stdout, (argv, out.stderr)


async def test_errors_say_their_code_once(served: Any) -> None:
    rt, admin, _ = served
    missing = "00000000-0000-0000-0000-000000000000"
    out = await awooop("runs", "show", missing, "--scheduler", f"127.0.0.1:{rt.ports['scheduler']}", "--key", admin)
    assert out.returncode == 1
    assert out.stderr.strip() == f"error: NOT_FOUND: run {missing} not found"
    out = await awooop("runs", "show", missing, "--scheduler", f"127.0.0.1:{rt.ports['scheduler']}", "--key", "awk_x_y")
    assert out.returncode == 1 and out.stderr.startswith("error: UNAUTHENTICATED: "), out.stderr


async def test_a_host_name_that_does_not_resolve_is_said_plainly(served: Any) -> None:
    _, admin, _ = served
    out = await awooop("runs", "list", "--project", PROJECT, "--scheduler", "nosuchhost.invalid:50052", "--key", admin)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        "error: UNAVAILABLE: cannot reach the scheduler at nosuchhost.invalid:50052 (the host name does not resolve); "
        "that address is from --scheduler: set it with --scheduler or AWOOOP_SCHEDULER_ADDR"
    ), out.stderr


async def test_another_services_port_names_the_address_and_how_to_change_it(served: Any) -> None:
    rt, admin, _ = served
    saga = f"127.0.0.1:{rt.ports['saga']}"  # a real awooop server, just not the scheduler
    out = await awooop("runs", "list", "--project", PROJECT, "--scheduler", saga, "--key", admin)
    assert out.returncode == 1
    assert out.stderr.strip() == (
        f"error: UNIMPLEMENTED: the server at {saga} does not serve the scheduler service (ListRuns): "
        "is it another service's port? That address is from --scheduler: set it with --scheduler or "
        "AWOOOP_SCHEDULER_ADDR"
    ), out.stderr


@pytest.mark.parametrize("reader", ["head -5", "true"])  # `true` leaves before anything is written
async def test_config_into_a_pipe_closed_early_is_quiet(reader: str) -> None:
    out = await asyncio.to_thread(
        subprocess.run,
        ["bash", "-c", f"set -o pipefail; '{sys.executable}' -m awooop.cli config | {reader}"],
        env={k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.stderr == "", out.stderr
    assert out.returncode == 0 and len(out.stdout.splitlines()) == (5 if reader.startswith("head") else 0)
