"""What an operator reads (issue 44): attempts as they count against max_attempts, the lease
generation apart (GetRun, ListRuns, `awooop runs show/list`, the console); why a parked run waits
(`runs show`); `runs watch` of a failed run following its compensation to the saga's end; and one
--json convention for every command. Real services, gateway, console and Postgres; the CLI as
real subprocesses."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest_asyncio
from google.protobuf.duration_pb2 import Duration

from awooop.cli.main import build_parser
from awooop.scheduler.v1 import scheduler_pb2
from tests.harness.console import PROJECT, ConsoleEnv, start_console_env, stop_console_env
from tests.harness.helpers import eventually


@pytest_asyncio.fixture(loop_scope="session")
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[ConsoleEnv]:
    e = await start_console_env(start_services, make_key, db)
    yield e
    await stop_console_env(e)


def _cli_cmd(env: ConsoleEnv, *args: str) -> tuple[list[str], dict[str, str]]:
    """`python -m awooop.cli ARGS` with every service's address as a flag and the admin key."""
    group = args[0]
    flags: list[str] = []
    scheduler = ("scheduler",)
    by_group = {
        "runs": ("scheduler", "saga"),
        "flow": scheduler,
        "builds": scheduler,
        "workers": scheduler,
        "channels": ("ingest",),
    }
    for service in by_group.get(group, ()):
        flags += [f"--{service}", env.addr(service)]
    cmd = [sys.executable, "-m", "awooop.cli", *args, *flags]
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    return cmd, clean | {"AWOOOP_API_KEY": env.admin_key}


async def _cli(env: ConsoleEnv, *args: str) -> subprocess.CompletedProcess[str]:
    cmd, environ = _cli_cmd(env, *args)
    return await asyncio.to_thread(subprocess.run, cmd, env=environ, capture_output=True, text=True, timeout=120)


def _fields(show_text: str) -> dict[str, str]:
    """The leading `label  value` rows of `runs show` (up to the first blank line)."""
    rows = {}
    for line in show_text.split("\n\n")[0].splitlines():
        label, _, value = line.partition("  ")
        rows[label.strip()] = value.strip()
    return rows


async def _hand_back(env: ConsoleEnv, lease: Any) -> None:
    await env.worker.call(env.worker.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=lease, reason="busy"))


# --- attempts: what counts against max_attempts, the lease generation apart ----------------------


async def test_attempts_shown_are_those_that_count_not_the_lease_generation(env: ConsoleEnv) -> None:
    """A run handed back twice and claimed a third time has spent one attempt of three (the one
    it holds), in its lease's third generation: GetRun, ListRuns, the CLI and the console say
    "1 of 3", and the generation is shown apart."""
    run_id = await env.create()
    for _ in range(2):
        await _hand_back(env, await env.claim(run_id))
    lease = await env.claim(run_id)
    assert lease.attempt == 3

    got = await env.admin.call(env.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))
    assert (got.run.attempts_used, got.run.attempt_count, got.run.max_attempts) == (1, 3, 3)
    listed = await env.admin.call(env.admin.scheduler.ListRuns, scheduler_pb2.ListRunsRequest(project_id=PROJECT))
    assert [(r.run_id, r.attempts_used) for r in listed.runs] == [(run_id, 1)]

    out = await _cli(env, "runs", "show", run_id)
    assert out.returncode == 0, out.stderr
    fields = _fields(out.stdout)
    assert fields["attempts"] == "1 of 3" and fields["lease generation"] == "3", out.stdout
    out = await _cli(env, "runs", "list", "--project", PROJECT)
    header, row = out.stdout.splitlines()
    assert header.split()[:3] == ["RUN_ID", "STATUS", "ATTEMPTS"] and row.split()[:3] == [run_id, "RUNNING", "1/3"]
    shown = json.loads((await _cli(env, "runs", "show", run_id, "--json")).stdout)["run"]
    assert (shown["attempts_used"], shown["attempt_count"]) == (1, 3)

    # a retryable failure spends the attempt; the retry's claim is the second of three
    await env.worker.call(
        env.worker.scheduler.FailRun,
        scheduler_pb2.FailRunRequest(lease=lease, reason="flaky", retryable=True, retry_after=Duration(nanos=10**7)),
    )

    async def used() -> int:
        r = await env.admin.call(env.admin.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))
        return int(r.run.attempts_used)

    assert await used() == 1  # failed once: one spent, two left
    await eventually(lambda: _claimable(env, run_id), what="the retry's backoff")
    await env.claim(run_id)
    assert await used() == 2

    async with env_browser(env) as browser:
        page = await browser.get(f"/runs/{run_id}")
        assert "<dt>attempts</dt><dd>2 of 3</dd>" in page and "<dt>lease generation</dt><dd>4</dd>" in page, page
        listing = await browser.get(f"/projects/{PROJECT}/runs")
        assert "2/3" in listing and "4/3" not in listing


async def _claimable(env: ConsoleEnv, run_id: str) -> bool:
    n = await env.db.fetchval(
        "SELECT count(*) FROM awooop_run_state WHERE run_id = $1 AND (not_before IS NULL OR not_before <= now())",
        run_id,
    )
    return bool(n)


class _Browser:
    def __init__(self, env: ConsoleEnv) -> None:
        import aiohttp

        self.env = env
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))

    async def get(self, path: str) -> str:
        async with self.http.get(self.env.url + path) as r:
            assert r.status == 200, (path, r.status)
            return await r.text()

    async def signin(self) -> None:
        import re

        page = await self.get("/signin")
        m = re.search(r'name="csrf" value="([^"]+)"', page)
        assert m, page
        data = {"csrf": m.group(1), "api_key": self.env.admin_key, "next": "/"}
        async with self.http.post(self.env.url + "/signin", data=data, allow_redirects=False) as r:
            assert r.status in (302, 303), r.status


@contextlib.asynccontextmanager
async def env_browser(env: ConsoleEnv) -> AsyncIterator[_Browser]:
    """A signed-in console session (a real aiohttp client keeping the session cookie)."""
    browser = _Browser(env)
    try:
        await browser.signin()
        yield browser
    finally:
        await browser.http.close()


# --- why a parked run waits ------------------------------------------------------------------------


async def test_runs_show_says_why_a_parked_run_waits(env: ConsoleEnv) -> None:
    run_id, _ = await env.parked_on_wait(timeout_s=3600)
    out = await _cli(env, "runs", "show", run_id)
    assert out.returncode == 0, out.stderr
    fields = _fields(out.stdout)
    assert fields["status"] == "WAITING_TOOL"
    assert fields["waiting"].startswith("parked on a wait token: resumes when CompleteWait or its callback URL answers")
    assert " until 20" in fields["waiting"], fields  # the wait's expiry
    # the park handed its attempt back: nothing spent, the lease's token moved on
    assert fields["attempts"] == "0 of 3" and fields["lease generation"] == "2", fields


# --- runs watch follows a failed run's compensation --------------------------------------------------


async def test_runs_watch_of_a_failed_run_follows_its_compensation_to_the_sagas_end(env: ConsoleEnv) -> None:
    run_id = await env.create()
    lease = await env.claim(run_id)
    await env.scale_step(lease)  # a tool call whose undo scales api back

    cmd, environ = _cli_cmd(env, "runs", "watch", run_id)
    watcher = await asyncio.create_subprocess_exec(
        *cmd, env=environ, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert watcher.stdout is not None
    seen: list[str] = []
    while not any("CLAIMED" in line for line in seen):  # following live before the run fails
        line = await asyncio.wait_for(watcher.stdout.readline(), 30)
        assert line, "the watch ended early"
        seen.append(line.decode())
    await env.worker.call(
        env.worker.scheduler.FailRun,
        scheduler_pb2.FailRunRequest(lease=lease, reason="downstream refused", retryable=False),
    )
    rest, err = await asyncio.wait_for(watcher.communicate(), 60)
    assert watcher.returncode == 0, err.decode()
    lines = [*seen, *rest.decode().splitlines(keepends=True)]
    text = "".join(lines)
    order = [
        next(i for i, line in enumerate(lines) if marker in line)
        for marker in ("FAILED", "SAGA_COMPENSATION_STARTED", "SAGA_STEP_COMPENSATED", "SAGA_COMPENSATION_ENDED")
    ]
    assert order == sorted(order), text
    assert lines[-2].strip() == "ended  FAILED  (saga compensated)", text
    assert lines[-1].strip() == "reason downstream refused", text

    # --json: one object per line, an event or (last) the run; a watch after the end replays it all
    out = await _cli(env, "runs", "watch", run_id, "--json")
    assert out.returncode == 0, out.stderr
    items = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(isinstance(i, dict) and len(i) == 1 for i in items)
    assert {next(iter(i)) for i in items[:-1]} == {"event"} and set(items[-1]) == {"run"}
    assert items[-1]["run"]["saga_status"] == "SAGA_STATUS_COMPENSATED"
    assert "SAGA_COMPENSATION_ENDED" in [i["event"]["kind"] for i in items[:-1]]


# --- one --json convention ---------------------------------------------------------------------------


def _json_commands() -> set[tuple[str, ...]]:
    """Every command (path of subcommands) that takes --json."""
    found: set[tuple[str, ...]] = set()

    def walk(parser: argparse.ArgumentParser, path: tuple[str, ...]) -> None:
        if any("--json" in a.option_strings for a in parser._actions):
            found.add(path)
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, (*path, name))

    walk(build_parser(), ())
    return found


async def test_every_json_command_prints_one_object_with_lists_under_a_named_key(
    env: ConsoleEnv, tmp_path: Path
) -> None:
    """docs/cli.md's convention: --json prints one JSON object; a list sits under a named key (with
    next_page_token where it is paged); `runs watch` prints one such object per line. Every
    command that takes --json is run here; a new one fails this test until it is added."""
    approve_id, approve_token = await env.waiting_for_approval()
    reject_id, reject_token = await env.waiting_for_approval()
    parked_a, _ = await env.parked_on_wait()
    parked_b, _ = await env.parked_on_wait()
    failed = await env.failed_compensation()
    held = await env.create()  # a run its worker held (its code did not replay its journal)
    hold = scheduler_pb2.HoldRunRequest(lease=await env.claim(held), reason="replay differs")
    await env.worker.call(env.worker.scheduler.HoldRun, hold)
    queued = await env.create()  # last: the helpers above claim the oldest claimable run
    moved = await env.create()
    dsn = env.rt.ctx.settings.database_url if env.rt.ctx else ""
    lists = {
        ("runs", "list"): ("runs", "next_page_token"),
        ("runs", "waits", "list"): ("waits",),
        ("flow", "schedules"): ("schedules",),
        ("flow", "debounces"): ("rules",),
        ("channels", "list"): ("endpoints",),
        ("admin", "list"): ("principals",),
        ("admin", "list-keys"): ("keys",),
        ("config",): ("settings",),
        ("builds", "list"): ("builds",),
        ("builds", "patches"): ("patches",),
        ("workers", "list"): ("workers",),
    }
    commands: dict[tuple[str, ...], list[str]] = {
        ("runs", "list"): ["--project", PROJECT],
        ("runs", "show"): [approve_id],
        ("runs", "approve"): [approve_id, "--token", approve_token],
        ("runs", "reject"): [reject_id, "--token", reject_token],
        ("runs", "cancel"): [queued],
        ("runs", "unhold"): [held, "--build", "v2"],
        ("runs", "move"): [moved, "--build", "v2"],
        ("builds", "drain"): ["--project", PROJECT, "v1"],
        ("builds", "undrain"): ["--project", PROJECT, "v1"],
        ("builds", "list"): ["--project", PROJECT],
        ("builds", "patches"): ["--project", PROJECT],
        ("workers", "list"): ["--project", PROJECT],
        ("runs", "waits", "list"): [parked_a],
        ("runs", "waits", "complete"): [parked_a, "--result", '{"ok": true}'],
        ("runs", "waits", "expire"): [parked_b],
        ("runs", "compensation", "retry"): [failed, "--wait", "0"],
        ("flow", "show"): ["--project", PROJECT],
        ("flow", "set"): ["--project", PROJECT, "--max-attempts", "4"],
        ("flow", "limit"): ["--project", PROJECT, "ssh", "2"],
        ("flow", "schedule"): ["--project", PROJECT, "nightly", "0 3 * * *"],
        ("flow", "schedules"): ["--project", PROJECT],
        ("flow", "unschedule"): ["--project", PROJECT, "nightly"],
        ("flow", "debounce"): ["--project", PROJECT, "telegram", "message.chat.id", "--window", "5"],
        ("flow", "debounces"): ["--project", PROJECT],
        ("flow", "undebounce"): ["--project", PROJECT, "telegram"],
        ("channels", "add"): ["alertmanager", "prod", "--project", PROJECT, "--url", "https://hooks.example"],
        ("channels", "list"): ["--project", PROJECT],
        ("channels", "rotate"): ["alertmanager", "prod", "--project", PROJECT, "--url", "https://hooks.example"],
        ("channels", "remove"): ["alertmanager", "prod", "--project", PROJECT],
        ("admin", "list"): ["--database-url", dsn],
        ("admin", "list-keys"): ["--database-url", dsn],
        ("config",): [],
    }
    # run apart below: a stream (watch), after the retry's outcome (resolve), a long story (demo)
    apart = {("runs", "watch"), ("runs", "compensation", "resolve"), ("demo",)}
    assert set(commands) | apart == _json_commands()
    for path, args in commands.items():  # in order: flow schedule before unschedule (debounce too), add before remove
        out = await _cli(env, *path, *args, "--json")
        assert out.returncode == 0, (path, out.stdout, out.stderr)
        data = json.loads(out.stdout)
        assert isinstance(data, dict), (path, out.stdout)
        for key in lists.get(path, ()):
            assert key in data, (path, key, list(data))
        if path in lists:
            assert isinstance(data[lists[path][0]], list), path

    async def failed_again() -> bool:
        return await env.saga_status(failed) == "compensation_failed"

    await eventually(failed_again, timeout=30, what="the retried compensation failing again")
    out = await _cli(env, "runs", "compensation", "resolve", failed, "--step", "scale", "--reason", "by hand", "--json")
    assert out.returncode == 0, out.stderr
    assert isinstance(json.loads(out.stdout), dict)
    out = await _cli(env, "runs", "watch", reject_id, "--json")
    assert out.returncode == 0, out.stderr
    assert all(isinstance(json.loads(line), dict) for line in out.stdout.splitlines())
    summary = await env.run_demo("demo-json", tmp_path)  # asserts the output is one object
    assert isinstance(summary, dict)
