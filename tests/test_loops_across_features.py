"""The background loops where features meet: several projects with their own flow settings, a
paused project, concurrency keys and a schedule, with the loops running on their own timers (not
called by the test), so a pass that fails shows up as work that never happens."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import grpc
import pytest
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.scheduler import schedules
from tests.harness.flow import serve
from tests.harness.helpers import eventually, expect_error
from tests.harness.scheduler import dur, expire_lease, run_row
from tests.test_flow_control import policy


async def test_the_reaper_reaps_every_project_by_its_own_policy_while_several_have_flow_settings(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key, reaper_interval=0.2, retry_backoff=5.0)
    ops = await make_key("ops", {"p": ["admin", "ingest", "worker"], "q": ["admin"], "r": ["admin", "ingest"]})
    for project, initial in (("p", 100), ("q", 200)):
        flow = pb.SetProjectFlowRequest(
            project_id=project, retry_policy=policy(initial=initial, multiplier=1, max=1000), weight=2
        )
        await f.sched.SetProjectFlow(flow, metadata=ops)
    await f.sched.SetConcurrencyLimit(
        pb.SetConcurrencyLimitRequest(project_id="p", key="deploy", max_running=1), metadata=ops
    )
    # r: no flow settings, paused after its run was claimed (a paused project's leases still expire)
    runs = {
        "p": await f.create("p-run", concurrency_keys=["deploy"]),
        "q": await f.create("q-run", project="q"),
    }
    waiting_on_key = await f.create("p-next", concurrency_keys=["deploy"])
    r_worker = await make_key("r-worker", {"r": ["worker", "ingest"]}, "service")
    create_r = ingest_pb2.CreateRunRequest(project_id="r", idempotency_key="r-run")
    runs["r"] = (await f.ingest.CreateRun(create_r, metadata=r_worker)).run
    claimed = await f.claim(["p", "q"], max_runs=10)
    claimed += list(
        (await f.sched.ClaimRuns(pb.ClaimRunsRequest(worker_id="w", project_ids=["r"]), metadata=r_worker)).runs
    )
    assert {c.run.run_id for c in claimed} == {r.run_id for r in runs.values()}  # p-next waits for the key
    await f.sched.PauseProject(pb.PauseProjectRequest(project_id="r", reason="maintenance"), metadata=ops)

    # every worker crashed: their leases lapse, and the reaper's own loop must take them all back
    for run in runs.values():
        await expire_lease(db, run.run_id)

    async def all_reaped() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1::uuid[]) AND status = 'PENDING'"
            " AND reaped_at IS NOT NULL",
            [uuid.UUID(r.run_id) for r in runs.values()],
        )
        return bool(n == len(runs))

    await eventually(all_reaped, timeout=20, what="the reaper loop to requeue every project's expired lease")
    for project, backoff in (("p", 100.0), ("q", 200.0), ("r", 5.0)):
        row = await db.fetchrow(
            "SELECT extract(epoch FROM not_before - reaped_at)::float8 AS backoff, wait_reason, worker_id"
            " FROM awooop_run_state WHERE run_id = $1",
            uuid.UUID(runs[project].run_id),
        )
        assert row is not None
        assert (round(row["backoff"], 3), row["wait_reason"], row["worker_id"]) == (backoff, "backoff", None), project
    # the reaped run gave its key's slot back: the next run with the key is claimable at once
    (c,) = await f.claim(["p"], wait=dur(5))
    assert c.run.run_id == waiting_on_key.run_id
    assert c.run.status == common_pb2.RUN_STATUS_RUNNING


async def _history_actions(db: Any, run_id: str) -> list[str]:
    rows = await db.fetch("SELECT action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id", uuid.UUID(run_id))
    return [r["action"] for r in rows]


def _loop_errors(loop: str, reason: str) -> float:
    return REGISTRY.get_sample_value("awooop_loop_errors_total", {"loop": loop, "reason": reason}) or 0.0


def _ok_passes(loop: str) -> float:
    return REGISTRY.get_sample_value("awooop_background_runs_total", {"loop": loop, "outcome": "ok"}) or 0.0


@pytest.mark.loop_errors("row_failed")
async def test_a_run_the_reaper_cannot_write_is_skipped_and_named_and_every_other_lease_is_reaped(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key, reaper_interval=0.2)
    ops = await make_key("ops", {"p": ["admin"], "q": ["admin"]})
    for project in ("p", "q"):
        flow = pb.SetProjectFlowRequest(project_id=project, retry_policy=policy(initial=30), weight=3)
        await f.sched.SetProjectFlow(flow, metadata=ops)
    bad = await f.create("bad")
    good = [await f.create("good-p"), await f.create("good-q", project="q")]
    assert len(await f.claim(["p", "q"], max_runs=10)) == 3
    # a run whose stored policy no statement can read (as an older version or a hand edit may leave)
    await db.execute(
        """UPDATE awooop_run_state SET retry_policy = '{"initial_backoff": "soon"}' WHERE run_id = $1""",
        uuid.UUID(bad.run_id),
    )
    rows_before = _loop_errors("scheduler.reaper", "row_failed")
    for run in (bad, *good):
        await expire_lease(db, run.run_id)

    async def good_reaped() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1::uuid[]) AND status = 'PENDING'",
            [uuid.UUID(r.run_id) for r in good],
        )
        return bool(n == len(good))

    await eventually(good_reaped, timeout=20, what="the reaper to requeue the leases beside the bad run")
    passes = _ok_passes("scheduler.reaper")

    async def three_more_passes() -> bool:
        return _ok_passes("scheduler.reaper") >= passes + 3

    await eventually(three_more_passes, timeout=20, what="three more reaper passes")
    assert (await run_row(db, bad.run_id))["status"] == "RUNNING"
    assert _loop_errors("scheduler.reaper", "row_failed") >= rows_before + 3  # every pass says so
    # the run's history names the error once, however many passes met it
    assert (await _history_actions(db, bad.run_id)).count("LOOP_ERROR") == 1
    note = await db.fetchrow(
        "SELECT actor, reason, details FROM awooop_audit_log WHERE run_id = $1 AND action = 'LOOP_ERROR'",
        uuid.UUID(bad.run_id),
    )
    assert note["actor"] == "system:reaper" and "double precision" in note["reason"]
    # mended by hand, the next pass reaps it
    await db.execute("UPDATE awooop_run_state SET retry_policy = NULL WHERE run_id = $1", uuid.UUID(bad.run_id))

    async def bad_reaped() -> bool:
        return bool((await run_row(db, bad.run_id))["status"] == "PENDING")

    await eventually(bad_reaped, timeout=20, what="the mended run reaped")


@pytest.mark.loop_errors("row_failed")
async def test_an_approval_the_sweep_cannot_expire_is_skipped_and_the_others_expire(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key, approval_sweep_interval=0.2)
    runs = [await f.create(f"ask-{i}", project=p) for i, p in enumerate(("p", "q", "p"))]
    for c in await f.claim(["p", "q"], max_runs=10):
        await f.sched.RequestApproval(pb.RequestApprovalRequest(lease=c.lease, summary="go?"), metadata=f.worker)
    bad = runs[0]
    # a row no statement may change (here: a trigger; in life, a constraint the data breaks)
    await db.execute(
        f"""CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN IF OLD.run_id = '{bad.run_id}' THEN RAISE EXCEPTION 'row refused'; END IF; RETURN NEW; END $$;
            CREATE TRIGGER refuse BEFORE UPDATE ON awooop_run_state FOR EACH ROW EXECUTE FUNCTION refuse();"""
    )
    await db.execute(
        "UPDATE awooop_run_state SET approval_expires_at = now() - interval '1 second'"
        " WHERE status = 'WAITING_APPROVAL' AND run_id <> $1",
        uuid.UUID(bad.run_id),
    )
    await db.execute("ALTER TABLE awooop_run_state DISABLE TRIGGER refuse")
    await db.execute(
        "UPDATE awooop_run_state SET approval_expires_at = now() - interval '1 second' WHERE run_id = $1",
        uuid.UUID(bad.run_id),
    )
    await db.execute("ALTER TABLE awooop_run_state ENABLE TRIGGER refuse")

    async def others_expired() -> bool:
        n = await db.fetchval(
            "SELECT count(*) FROM awooop_run_state WHERE run_id = ANY($1::uuid[]) AND status = 'FAILED'"
            " AND error_code = 'E-APPROVAL-002'",
            [uuid.UUID(r.run_id) for r in runs[1:]],
        )
        return bool(n == 2)

    await eventually(others_expired, timeout=20, what="the sweep to expire the approvals beside the bad run")
    assert (await run_row(db, bad.run_id))["status"] == "WAITING_APPROVAL"
    assert "LOOP_ERROR" in await _history_actions(db, bad.run_id)
    assert _loop_errors("scheduler.approval_sweep", "row_failed") >= 1


@pytest.mark.loop_errors("row_failed")
async def test_a_schedule_that_fails_or_has_no_tick_left_stops_no_other_projects_schedules(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key, schedule_interval=0.1)
    ops = await make_key("ops", {"p": ["admin"], "q": ["admin"], "r": ["admin", "worker"]})
    await f.sched.PauseProject(pb.PauseProjectRequest(project_id="q", reason="paused, still scheduled"), metadata=ops)
    # r's schedules, as the store may hold them: a time zone the host no longer knows, and one whose
    # only tick (seconds first, a year) is due now and has no successor
    now = await db.fetchval("SELECT date_trunc('second', now()) - interval '2 seconds'")
    last_cron = f"{now.second} {now.minute} {now.hour} {now.day} {now.month} * {now.year}"
    await db.execute(
        """INSERT INTO awooop_schedule (project_id, name, cron, time_zone, next_tick) VALUES
           ('r', 'gone-zone', '* * * * *', 'Mars/Olympus_Mons', now() - interval '1 minute'),
           ('r', 'last-tick', $1, 'UTC', $2)""",
        last_cron,
        now,
    )
    rows_before = _loop_errors("scheduler.schedules", "row_failed")
    for project in ("p", "q"):
        every_second = pb.Schedule(project_id=project, name="tick", cron="* * * * * *")
        await f.sched.SetSchedule(pb.SetScheduleRequest(schedule=every_second), metadata=ops)

    async def ticks(project: str) -> int:
        return int(
            await db.fetchval(
                "SELECT count(*) FROM awooop_run_state WHERE project_id = $1 AND provider_event_id LIKE 'schedule:%'",
                project,
            )
        )

    async def both_ticking() -> bool:
        return await ticks("p") >= 3 and await ticks("q") >= 3

    await eventually(both_ticking, timeout=30, what="p's and q's schedules to tick beside r's bad ones")
    listed = {
        s.name: s
        for s in (await f.sched.ListSchedules(pb.ListSchedulesRequest(project_id="r"), metadata=ops)).schedules
    }
    assert "time zone" in listed["gone-zone"].last_error and listed["gone-zone"].HasField("last_error_at")
    assert "never fires" in listed["last-tick"].last_error
    assert listed["last-tick"].next_tick.ToDatetime().year == 9999
    assert await ticks("r") == 1  # the last tick fired once; the broken schedule fired nothing
    # the failing schedule is retried an hour later, not every pass
    assert _loop_errors("scheduler.schedules", "row_failed") == rows_before + 1
    # set again (mended), it fires and its error is gone
    mended = pb.Schedule(project_id="r", name="gone-zone", cron="* * * * * *", time_zone="Europe/Berlin")
    stored = (await f.sched.SetSchedule(pb.SetScheduleRequest(schedule=mended), metadata=ops)).schedule
    assert stored.last_error == "" and not stored.HasField("last_error_at")

    async def r_ticking() -> bool:
        return await ticks("r") >= 2

    await eventually(r_ticking, timeout=30, what="the mended schedule to tick")


async def test_six_fields_are_seconds_first_and_schedules_that_never_fire_are_invalid_argument(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    f = await serve(start_services, channels, db, make_key)
    # second 9 of every minute: once a minute (croniter alone reads the sixth field as the seconds)
    once_a_minute = pb.Schedule(project_id="p", name="m", cron="9 * * * * *")
    stored = (await f.sched.SetSchedule(pb.SetScheduleRequest(schedule=once_a_minute), metadata=f.admin)).schedule
    first = stored.next_tick.ToDatetime(tzinfo=dt.UTC)
    assert first.second == 9 and first.microsecond == 0
    assert schedules.next_after("9 * * * * *", "UTC", first) - first == dt.timedelta(minutes=1)
    assert schedules.next_after("0 30 6 * * * 2050", "UTC", first) == dt.datetime(2050, 1, 1, 6, 30, tzinfo=dt.UTC)
    for cron, tz, field in (
        ("0 0 30 2 *", "UTC", "schedule.cron"),  # 30 February
        ("0 0 0 1 1 * 2020", "UTC", "schedule.cron"),  # a year in the past
        ("0 0 0 1 1 * 2199", "UTC", "schedule.cron"),  # further ahead than croniter looks
        ("x" * 257, "UTC", "schedule.cron"),
        ("* * * * * * * *", "UTC", "schedule.cron"),
        ("* * * * *", "E" * 300, "schedule.time_zone"),
        ("* * * * *", "../../etc/passwd", "schedule.time_zone"),
    ):
        bad = pb.SetScheduleRequest(schedule=pb.Schedule(project_id="p", name="bad", cron=cron, time_zone=tz))
        err = await expect_error(f.sched.SetSchedule(bad, metadata=f.admin), grpc.StatusCode.INVALID_ARGUMENT)
        assert field in (err.details() or ""), (cron, tz, err.details())
    assert await db.fetchval("SELECT count(*) FROM awooop_schedule WHERE name = 'bad'") == 0
