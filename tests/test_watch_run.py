"""Watching runs (issue 28): ctx.emit journals progress events under the run's lease, and
WatchRun / the SSE stream deliver a run's state changes, steps and progress events in order,
from any offset, then live, then the run's output. Real services (scheduler, saga, ingest's HTTP
server), real Postgres, a real SDK worker over gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Client, Event, LeaseLost, RunContext, Worker, to_struct, watch_run
from services.common import audit_sql, errors
from services.common.runtime import Runtime
from tests.harness.helpers import eventually, key_of, lock_waiters

PROJECT = "watch"
OTHER = "watch-other"


@dataclass
class Suite:
    sched: Runtime
    ingest: Runtime
    worker_key: str
    admin_key: str
    admin: Client
    worker_client: Client
    other: Client  # an admin of another project

    @property
    def scheduler(self) -> str:
        return f"127.0.0.1:{self.sched.ports['scheduler']}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ingest.http_ports['ingest']}"

    async def create_run(self) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=PROJECT,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({"ask": "watch"}),
            ),
        )
        return str(resp.outcomes[0].run_id)

    async def claim(self, run_id: str) -> common_pb2.LeaseToken:
        c = self.worker_client
        claimed = await c.call(
            c.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=10)
        )
        leases = [r.lease for r in claimed.runs if r.lease.run_id == run_id]
        assert leases, "the run was not claimed"
        return leases[0]

    async def emit(self, lease: common_pb2.LeaseToken, data: dict[str, Any], **kw: Any) -> Any:
        c = self.worker_client
        return await c.call(
            c.scheduler.EmitEvent, scheduler_pb2.EmitEventRequest(lease=lease, data=to_struct(data), **kw)
        )


async def _suite(start_services: Any, make_key: Any, **overrides: Any) -> Suite:
    sched = await start_services("scheduler", "saga", reaper_interval=0.2, auth_cache_seconds=0, **overrides)
    ingest = await start_services(
        "ingest", scheduler_addr=f"127.0.0.1:{sched.ports['scheduler']}", auth_cache_seconds=0
    )
    worker_key = key_of(await make_key("watch-worker", {PROJECT: ["worker"]}, "service"))
    admin_key = key_of(await make_key("watch-admin", {PROJECT: ["admin"]}))
    other_key = key_of(await make_key("watch-other", {OTHER: ["admin"]}))
    addrs = {"ingest": f"127.0.0.1:{ingest.ports['ingest']}", "scheduler": f"127.0.0.1:{sched.ports['scheduler']}"}
    return Suite(
        sched,
        ingest,
        worker_key,
        admin_key,
        Client(key=admin_key, **addrs),
        Client(key=worker_key, **addrs),
        Client(key=other_key, **addrs),
    )


@pytest.fixture
async def suite(start_services: Any, make_key: Any) -> AsyncIterator[Suite]:
    s = await _suite(start_services, make_key)
    yield s
    for c in (s.admin, s.worker_client, s.other):
        await c.close()


async def _grpc_watch(
    client: Client, run_id: str, after: int = 0, events: list[Any] | None = None
) -> tuple[list[Event], common_pb2.Run]:
    events = [] if events is None else events
    async for item in watch_run(client, run_id, after=after):
        if isinstance(item, Event):
            events.append(item)
        else:
            return events, item
    raise AssertionError("the stream ended without the run")


async def _sse(
    url: str,
    key: str,
    *,
    last_event_id: int | None = None,
    stop_after: int | None = None,
    events: list[Any] | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    """Reads an SSE stream: (events, the end event's run or None when stopped early)."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_event_id is not None:
        headers["Last-Event-ID"] = str(last_event_id)
    events = [] if events is None else events
    async with aiohttp.ClientSession() as s, s.get(url, headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        fields: dict[str, str] = {}
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line:
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            data = json.loads(fields["data"])
            if fields["event"] == "end":
                return events, data
            assert fields["event"] in ("state", "step", "progress")
            assert int(fields["id"]) == data["offset"]
            events.append(data)
            fields = {}
            if stop_after is not None and len(events) >= stop_after:
                return events, None
    raise AssertionError("the SSE stream ended without the run")


def _progress(events: list[Any]) -> list[int]:
    return [
        (e.data if isinstance(e, Event) else e["data"])["n"]
        for e in events
        if (e.source if isinstance(e, Event) else e["source"]) == "progress"
    ]


def _offsets(events: list[Any]) -> list[int]:
    return [e.offset if isinstance(e, Event) else e["offset"] for e in events]


# --- the done-when test ---------------------------------------------------------------------------


async def test_a_late_watcher_gets_every_progress_event_in_order_then_the_output(suite: Suite) -> None:
    """A client that starts watching after half of a run's progress events were emitted receives
    all of them, in order, then the run's output: over gRPC and over SSE, with a real SDK worker."""
    half = asyncio.Event()
    gate = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        for n in range(10):
            if n == 5:
                half.set()
                await gate.wait()
            await ctx.emit({"n": n}, kind="tick")
        await ctx.step("answer", lambda call: {"text": "done"}, step_type="llm_call")
        return {"total": 10}

    worker = Worker(
        handler,
        projects=[PROJECT],
        key=suite.worker_key,
        scheduler=suite.scheduler,
        saga=f"127.0.0.1:{suite.sched.ports['saga']}",
        claim_wait=1,
    )
    task = asyncio.create_task(worker.run())
    try:
        run_id = await suite.create_run()
        await asyncio.wait_for(half.wait(), 30)
        seen_grpc: list[Any] = []
        seen_sse: list[Any] = []
        grpc_watch = asyncio.create_task(_grpc_watch(suite.admin, run_id, events=seen_grpc))
        sse_watch = asyncio.create_task(_sse(f"{suite.http}/v1/runs/{run_id}/events", suite.admin_key, events=seen_sse))

        async def both_have_the_first_half() -> bool:
            # the events emitted before the watchers attached reached them; the rest come live
            return _progress(seen_grpc) == list(range(5)) and _progress(seen_sse) == list(range(5))

        await eventually(both_have_the_first_half, timeout=30, what="the first half delivered")
        gate.set()
        (events, run), (sse_events, sse_run) = await asyncio.wait_for(asyncio.gather(grpc_watch, sse_watch), 30)
    finally:
        gate.set()
        worker.stop()
        await asyncio.wait_for(task, 30)

    assert _progress(events) == list(range(10))
    assert _progress(sse_events) == list(range(10))
    offsets = _offsets(events)
    assert offsets == list(range(1, len(offsets) + 1))  # every row of the log, once, in order
    assert _offsets(sse_events) == offsets
    kinds = [(e.source, e.kind) for e in events]
    assert ("state", "CLAIMED") in kinds and ("step", "completed") in kinds
    assert ("state", "COMPLETED") in kinds
    # the progress events come between the claim and the end
    assert kinds.index(("state", "CLAIMED")) < kinds.index(("progress", "tick"))
    assert run.status == common_pb2.RUN_STATUS_COMPLETED
    assert dict(run.output) == {"total": 10}
    assert sse_run is not None and sse_run["status"] == "RUN_STATUS_COMPLETED" and sse_run["output"] == {"total": 10}


# --- resuming, authorization, bad offsets ---------------------------------------------------------


async def _finished_run(suite: Suite, n: int) -> str:
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    for i in range(n):
        await suite.emit(lease, {"n": i})
    c = suite.worker_client
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease, output=to_struct({"ok": True})))
    return run_id


async def test_a_watcher_resumes_from_its_offset_after_disconnecting(suite: Suite) -> None:
    run_id = await _finished_run(suite, 8)
    full, _ = await _grpc_watch(suite.admin, run_id)
    assert _progress(full) == list(range(8))

    # over gRPC: read four rows, drop the stream, resume after the last offset received
    first: list[Event] = []
    async for item in watch_run(suite.admin, run_id):
        assert isinstance(item, Event)
        first.append(item)
        if len(first) == 4:
            break
    rest, run2 = await _grpc_watch(suite.admin, run_id, after=first[-1].offset)
    assert _offsets(first + rest) == _offsets(full)
    assert dict(run2.output) == {"ok": True}

    # over SSE: Last-Event-ID resumes
    url = f"{suite.http}/v1/runs/{run_id}/events"
    head, end = await _sse(url, suite.admin_key, stop_after=3)
    assert end is None
    tail, end = await _sse(url, suite.admin_key, last_event_id=head[-1]["offset"])
    assert _offsets(head + tail) == _offsets(full)
    assert end is not None and end["output"] == {"ok": True}


async def test_another_projects_run_is_not_found_and_a_bad_offset_is_invalid(suite: Suite) -> None:
    run_id = await _finished_run(suite, 2)
    with pytest.raises(AwooopError) as caught:
        await _grpc_watch(suite.other, run_id)
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    async with aiohttp.ClientSession() as s:
        url = f"{suite.http}/v1/runs/{run_id}/events"
        async with s.get(url, headers={"Authorization": f"Bearer {suite.other.key}"}) as resp:
            assert resp.status == 404
            assert (await resp.json(content_type=None))["reason"] == errors.NOT_FOUND
        async with s.get(url) as resp:  # no key
            assert resp.status == 401
        async with s.get(url, headers={"Authorization": f"Bearer {suite.admin_key}", "Last-Event-ID": "x"}) as resp:
            assert resp.status == 400
        async with s.get(url, headers={"Authorization": f"Bearer {suite.admin_key}", "Last-Event-ID": "999"}) as resp:
            assert resp.status == 400
            assert (await resp.json(content_type=None))["reason"] == errors.FIELD_INVALID
        # offsets no int64 holds, or no stream sends, are 400 naming where they came from (issue 41,
        # item 5: past 2^63 - 1 they were a 503 with a traceback, which an EventSource retries forever)
        admin = {"Authorization": f"Bearer {suite.admin_key}"}
        for header, query, field in [
            ("9223372036854775808", "", "headers.Last-Event-ID"),
            ("", "?after=99999999999999999999999", "query.after"),
            ("", "?after=-1", "query.after"),
            ("", "?after=1e3", "query.after"),
            ("-5", "?after=1", "headers.Last-Event-ID"),
        ]:
            headers = admin | ({"Last-Event-ID": header} if header else {})
            async with s.get(url + query, headers=headers) as resp:
                doc = await resp.json(content_type=None)
                assert (resp.status, doc["reason"]) == (400, errors.FIELD_INVALID), (header, query, doc)
                assert field in json.dumps(doc), (field, doc)
    with pytest.raises(AwooopError) as caught:
        await _grpc_watch(suite.admin, run_id, after=999)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(AwooopError) as caught:
        await _grpc_watch(suite.admin, run_id, after=-1)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT


# --- emitting: fencing, concurrency, keys, bounds -------------------------------------------------


async def test_a_stale_lease_cannot_emit(suite: Suite) -> None:
    run_id = await suite.create_run()
    stale = await suite.claim(run_id)
    c = suite.worker_client
    await c.call(c.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=stale))
    fresh = await suite.claim(run_id)
    assert fresh.attempt > stale.attempt
    with pytest.raises(LeaseLost) as caught:
        await suite.emit(stale, {"from": "the old attempt"})
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION
    ok = await suite.emit(fresh, {"from": "the live attempt"})
    assert ok.count == 1
    # another project's worker: NOT_FOUND, and nothing written
    with pytest.raises(AwooopError) as caught:
        await suite.other.call(
            suite.other.scheduler.EmitEvent, scheduler_pb2.EmitEventRequest(lease=fresh, data=to_struct({}))
        )
    assert caught.value.code == grpc.StatusCode.NOT_FOUND
    await suite.worker_client.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=fresh))
    events, _ = await _grpc_watch(suite.admin, run_id)
    assert [e.data for e in events if e.source == "progress"] == [{"from": "the live attempt"}]


async def test_concurrent_emits_get_distinct_consecutive_offsets(suite: Suite) -> None:
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    answers = await asyncio.gather(*(suite.emit(lease, {"n": i}) for i in range(40)))
    offsets = sorted(a.offset for a in answers)
    assert offsets == list(range(offsets[0], offsets[0] + 40))
    assert sorted(a.count for a in answers) == list(range(1, 41))
    # concurrent with state changes of the same run: still one gapless order
    c = suite.worker_client
    more = asyncio.gather(*(suite.emit(lease, {"n": 40 + i}) for i in range(10)))
    beat = c.call(c.scheduler.WaitTool, scheduler_pb2.WaitToolRequest(lease=lease, tool_id="slow"))
    await asyncio.gather(more, beat)
    await c.call(c.scheduler.ResumeTool, scheduler_pb2.ResumeToolRequest(lease=lease))
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
    events, _ = await _grpc_watch(suite.admin, run_id)
    assert _offsets(events) == list(range(1, len(events) + 1))
    assert sorted(_progress(events)) == list(range(50))


async def test_an_emit_key_makes_a_repeated_emit_a_no_op(suite: Suite) -> None:
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    first = await suite.emit(lease, {"chunk": 1}, key="chunk-1")
    again = await asyncio.gather(*(suite.emit(lease, {"chunk": 1}, key="chunk-1") for _ in range(5)))
    assert not first.duplicate
    assert {a.offset for a in again} == {first.offset} and all(a.duplicate for a in again)
    assert (await suite.emit(lease, {"chunk": 2}, key="chunk-2")).count == 2


async def test_progress_data_is_stored_as_the_object_sent(suite: Suite, db: asyncpg.Connection) -> None:
    """SQL over the log sees an emitted event's fields (`data ->> 'text'`), and the run's byte
    bound counts the event's compact JSON, not an escaped copy of it."""
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    sent = {"text": 'say "hi"'}
    await suite.emit(lease, sent)
    row = await db.fetchrow(
        "SELECT jsonb_typeof(data) AS type, data ->> 'text' AS text, progress_bytes"
        " FROM awooop_run_event WHERE run_id = $1 AND source = 'progress'",
        run_id,
    )
    assert row is not None
    assert (row["type"], row["text"]) == ("object", 'say "hi"')
    # the size of the text Postgres stores for it (its own spacing), as the function measures it
    assert row["progress_bytes"] == len(json.dumps(sent).encode())


async def test_progress_rows_stored_as_strings_become_objects(db: asyncpg.Connection) -> None:
    """Migration 0251 parses the progress rows EmitEvent stored as JSON strings before it was fixed,
    and leaves every other row as it was."""
    from pathlib import Path

    import services

    migration = Path(services.__file__).parent / "common" / "migrations" / "0251_progress_data_as_objects.sql"
    run_id = "6f1c2a52-0000-4000-8000-000000000001"
    await db.execute(
        "INSERT INTO awooop_run_event (run_id, seq, project_id, source, kind, data, attempt) VALUES"
        " ($1, 1, 'p', 'progress', 'tick', to_jsonb('{\"n\":1}'::text), 1),"
        " ($1, 2, 'p', 'progress', 'tick', '{\"n\":2}'::jsonb, 1),"
        " ($1, 3, 'p', 'state', 'CLAIMED', '{\"action\":\"CLAIMED\"}'::jsonb, 1)",
        run_id,
    )
    await db.execute(migration.read_text())
    rows = await db.fetch("SELECT data::text FROM awooop_run_event WHERE run_id = $1 ORDER BY seq", run_id)
    assert [r["data"] for r in rows] == ['{"n": 1}', '{"n": 2}', '{"action": "CLAIMED"}']


async def test_bounds_give_a_clear_status(start_services: Any, make_key: Any) -> None:
    suite = await _suite(start_services, make_key, max_run_events=3, max_run_event_bytes=64, max_watchers=1)
    try:
        run_id = await suite.create_run()
        lease = await suite.claim(run_id)
        for i in range(3):
            await suite.emit(lease, {"n": i})
        with pytest.raises(AwooopError) as caught:
            await suite.emit(lease, {"n": 3})
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.reason == errors.RUN_EVENTS_EXHAUSTED
        assert caught.value.details.metadata["count"] == "3"
        with pytest.raises(AwooopError) as caught:  # one event over its size: bad input
            await suite.emit(lease, {"text": "x" * 100})
        assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert caught.value.details.violations[0][0] == "data"

        # one watcher per scheduler: a second one is refused while the first is open
        first = suite.admin.scheduler.WatchRun(
            scheduler_pb2.WatchRunRequest(run_id=run_id), metadata=suite.admin.metadata
        )
        assert (await first.read()).event.offset == 1
        with pytest.raises(AwooopError) as caught:
            await _grpc_watch(suite.admin, run_id)
        assert caught.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert caught.value.reason == errors.TOO_MANY_WATCHERS
        first.cancel()
    finally:
        for c in (suite.admin, suite.worker_client, suite.other):
            await c.close()


# --- visible: the CLI -------------------------------------------------------------------------------


async def _cli(suite: Suite, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env["AWOOOP_API_KEY"] = suite.admin_key
    cmd = [
        sys.executable,
        "-m",
        "awooop.cli",
        "runs",
        *args,
        "--scheduler",
        suite.scheduler,
        "--saga",
        f"127.0.0.1:{suite.sched.ports['saga']}",
    ]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=60)


async def test_runs_show_lists_progress_events_and_runs_watch_follows_a_run(suite: Suite) -> None:
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    await suite.emit(lease, {"n": 0, "note": "fetched"}, kind="fetch")
    watching = asyncio.create_task(_cli(suite, "watch", run_id))
    shown = await _cli(suite, "show", run_id, "--json")
    assert shown.returncode == 0, shown.stderr
    progress = json.loads(shown.stdout)["progress"]
    assert [(p["kind"], p["data"]) for p in progress] == [("fetch", {"n": 0, "note": "fetched"})]
    await suite.emit(lease, {"n": 1, "note": "summarised"}, kind="summarise")
    c = suite.worker_client
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease, output=to_struct({"ok": 1})))
    done = await asyncio.wait_for(watching, 60)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert any("progress  fetch" in line for line in lines)
    assert any("progress  summarise" in line for line in lines)
    assert lines[-2:] == ["ended  COMPLETED", 'output {"ok": 1}'] or lines[-2].startswith("ended  COMPLETED")
    text = await _cli(suite, "show", run_id)
    assert "progress events (2)" in text.stdout and "summarise" in text.stdout


# --- the log's sequence under writers that do not lock the run ------------------------------------


async def _audit(conn: asyncpg.Connection, run_id: Any, action: str) -> str:
    """One InsertAuditRow (details as JSON text: these connections have no jsonb codec)."""
    return await audit_sql.insert_audit_row(
        conn,
        project_id="watch",
        run_id=run_id,
        actor="t",
        action=action,
        from_status=None,
        to_status=None,
        reason=None,
        details="{}",
    )


async def test_audit_writers_racing_on_one_run_get_consecutive_offsets_in_commit_order(db_dsn: str) -> None:
    """Two transactions audit the same run without locking its row (as the saga's compensation
    audit can): the second one's statement meets the first's uncommitted seq, waits for it, and
    appends after it, so the log stays gapless and in commit order."""
    first, second, check = [await asyncpg.connect(db_dsn) for _ in range(3)]
    try:
        run_id = await check.fetchval(
            "INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id) "
            "VALUES ('watch', 'api', 'race') RETURNING run_id"
        )
        t1 = first.transaction()
        await t1.start()
        await _audit(first, run_id, "FIRST")
        t2 = second.transaction()
        await t2.start()
        blocked = asyncio.create_task(_audit(second, run_id, "SECOND"))

        # the second statement waits on the first's row
        await eventually(lambda: lock_waiters(check), what="the second writer waiting on the first")
        await t1.commit()
        await asyncio.wait_for(blocked, 10)
        await t2.commit()
        rows = await check.fetch("SELECT seq, kind FROM awooop_run_event WHERE run_id = $1 ORDER BY seq", run_id)
        assert [(r["seq"], r["kind"]) for r in rows] == [(1, "FIRST"), (2, "SECOND")]
    finally:
        for c in (first, second, check):
            await c.close()


async def test_live_events_arrive_by_notification_not_by_polling(start_services: Any, make_key: Any) -> None:
    """With the poll fallback set to five minutes, a watcher still gets each event and the run's
    end as they happen: the NOTIFY of a watched run's new log rows wakes it."""
    suite = await _suite(start_services, make_key, watch_poll_interval=300.0)
    try:
        run_id = await suite.create_run()
        lease = await suite.claim(run_id)
        seen: list[Any] = []
        watching = asyncio.create_task(_grpc_watch(suite.admin, run_id, events=seen))

        async def claimed_seen() -> bool:  # the durable part came first
            return any(e.kind == "CLAIMED" for e in seen)

        await eventually(claimed_seen, what="the durable part")
        for i in range(3):
            await suite.emit(lease, {"n": i})

            async def arrived(i: int = i) -> bool:
                return i in _progress(seen)

            await eventually(arrived, timeout=60, what=f"event {i} live")
        c = suite.worker_client
        await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
        _, run = await asyncio.wait_for(watching, 60)
        assert run.status == common_pb2.RUN_STATUS_COMPLETED
    finally:
        for c in (suite.admin, suite.worker_client, suite.other):
            await c.close()


async def test_an_idle_sse_stream_sends_keepalive_comments(suite: Suite, monkeypatch: pytest.MonkeyPatch) -> None:
    from services.ingest import run_stream

    monkeypatch.setattr(run_stream, "KEEPALIVE_SECONDS", 0.2)  # read per wait: the live server uses it
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    headers = {"Authorization": f"Bearer {suite.admin_key}"}
    async with (
        aiohttp.ClientSession() as s,
        s.get(f"{suite.http}/v1/runs/{run_id}/events", headers=headers) as resp,
    ):
        assert resp.status == 200
        lines: list[str] = []
        async for raw in resp.content:
            lines.append(raw.decode().rstrip("\n"))
            if lines[-1] == ": keepalive":
                break
        assert any(line == "event: state" for line in lines)  # the durable part came before
        await suite.emit(lease, {"after": "the keepalive"})
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: ") and "the keepalive" in line:
                break
        else:
            raise AssertionError("the event after the keepalive did not arrive")
