"""The schedule RPCs (SetSchedule, ListSchedules, DeleteSchedule): validate the cron and time
zone, check the caller's role, call schedules, build the answer."""

from __future__ import annotations

import datetime as dt

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common.access import require_member, require_role
from services.common.auth import current_principal
from services.common.limits import MAX_CRON, MAX_SCHEDULE_NAME
from services.common.runs import ts
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import schedules


def _schedule_pb(s: schedules.Schedule) -> scheduler_pb2.Schedule:
    return scheduler_pb2.Schedule(
        project_id=s.project_id,
        name=s.name,
        cron=s.cron,
        time_zone=s.time_zone,
        input=to_struct(s.input),
        next_tick=ts(s.next_tick),
        last_error=s.last_error or "",
        last_error_at=ts(s.last_error_at),
    )


class ScheduleRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    async def set_schedule(self, request: scheduler_pb2.SetScheduleRequest) -> scheduler_pb2.SetScheduleResponse:
        v = Violations()
        sched = request.schedule
        project_id = v.project_id("schedule.project_id", sched.project_id)
        name = v.token("schedule.name", sched.name, max_len=MAX_SCHEDULE_NAME)
        cron = v.text("schedule.cron", sched.cron, max_len=MAX_CRON, required=True)
        time_zone = sched.time_zone or "UTC"
        try:
            schedules.zone(time_zone)
        except schedules.ScheduleError as exc:
            v.add("schedule.time_zone", str(exc))
            time_zone = "UTC"  # the cron is still checked, in UTC
        if cron:
            try:
                schedules.check_cron(cron)
                schedules.next_after(cron, time_zone, dt.datetime.now(dt.UTC))  # it fires at least once more
            except schedules.ScheduleError as exc:
                v.add("schedule.cron", str(exc))
        _, input_json = v.json("schedule.input", sched.input, max_bytes=self.settings.max_payload_bytes)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        try:
            stored = await schedules.set_schedule(
                self.pool, project_id, name, cron, time_zone, input_json, principal.actor
            )
        except schedules.ScheduleError as exc:  # its last tick passed since the check above
            v.add("schedule.cron", str(exc))
            v.raise_if_any()
            raise
        return scheduler_pb2.SetScheduleResponse(schedule=_schedule_pb(stored))

    async def list_schedules(self, request: scheduler_pb2.ListSchedulesRequest) -> scheduler_pb2.ListSchedulesResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        found = await schedules.list_schedules(self.pool, project_id)
        return scheduler_pb2.ListSchedulesResponse(schedules=[_schedule_pb(s) for s in found])

    async def delete_schedule(
        self, request: scheduler_pb2.DeleteScheduleRequest
    ) -> scheduler_pb2.DeleteScheduleResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        name = v.token("name", request.name, max_len=MAX_SCHEDULE_NAME)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        deleted = await schedules.delete_schedule(self.pool, project_id, name, principal.actor)
        return scheduler_pb2.DeleteScheduleResponse(deleted=deleted)
