"""ListBuilds, DrainBuild and SetRunBuild (docs/versioning.md), and ListWorkers (docs/flow-control.md,
"Worker labels"): validate, check the caller's role, call builds or workers, build the answer."""

from __future__ import annotations

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common import labels
from services.common.access import require_member
from services.common.auth import current_principal
from services.common.limits import MAX_ID, MAX_TEXT
from services.common.runs import run_to_pb, set_time
from services.common.settings import Settings
from services.common.validate import Violations
from services.scheduler import builds, builds_sql, workers, workers_sql


def build_to_pb(row: builds_sql.ProjectBuildsRow) -> scheduler_pb2.Build:
    b = scheduler_pb2.Build(
        project_id=row["project_id"],
        build_id=row["build_id"],
        live=row["live"],
        draining=row["draining"],
        drained_by=row["drained_by"] or "",
        newest=row["newest"],
        queued=row["queued"],
        held=row["held"],
        leased=row["leased"],
        parked=row["parked"],
        waiting_for_build=row["waiting_for_build"],
    )
    for field, value in (
        (b.first_seen_at, row["first_seen_at"]),
        (b.last_seen_at, row["last_seen_at"]),
        (b.drained_at, row["drained_at"]),
    ):
        if value is not None:
            set_time(field, value)
    return b


def worker_to_pb(row: workers_sql.ProjectWorkersRow) -> scheduler_pb2.Worker:
    w = scheduler_pb2.Worker(
        project_id=row["project_id"],
        worker_id=row["worker_id"],
        labels=labels.from_json(row["labels"]),
        live=row["live"],
        build_id=row["build_id"] or "",
    )
    set_time(w.first_seen_at, row["first_seen_at"])
    set_time(w.last_seen_at, row["last_seen_at"])
    return w


class BuildRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings

    async def _builds(self, project_id: str) -> list[scheduler_pb2.Build]:
        rows = await builds.project_builds(self.pool, project_id, self.settings.build_live_seconds)
        return [build_to_pb(r) for r in rows]

    async def list_builds(self, request: scheduler_pb2.ListBuildsRequest) -> scheduler_pb2.ListBuildsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        return scheduler_pb2.ListBuildsResponse(builds=await self._builds(project_id))

    async def list_workers(self, request: scheduler_pb2.ListWorkersRequest) -> scheduler_pb2.ListWorkersResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        rows = await workers.project_workers(self.pool, project_id, self.settings.worker_live_seconds)
        return scheduler_pb2.ListWorkersResponse(workers=[worker_to_pb(r) for r in rows])

    async def list_patches(self, request: scheduler_pb2.ListPatchesRequest) -> scheduler_pb2.ListPatchesResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        rows = await builds.project_patches(self.pool, project_id)
        return scheduler_pb2.ListPatchesResponse(
            patches=[
                scheduler_pb2.Patch(change_id=r["change_id"], patched=r["patched"], unpatched=r["unpatched"])
                for r in rows
            ]
        )

    async def drain_build(self, request: scheduler_pb2.DrainBuildRequest) -> scheduler_pb2.DrainBuildResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        build_id = v.token("build_id", request.build_id, max_len=MAX_ID)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        await builds.drain(self.pool, current_principal(), project_id, build_id, undrain=request.undrain, reason=reason)
        drained = next(b for b in await self._builds(project_id) if b.build_id == build_id)
        return scheduler_pb2.DrainBuildResponse(build=drained)

    async def set_run_build(self, request: scheduler_pb2.SetRunBuildRequest) -> scheduler_pb2.SetRunBuildResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        build_id = v.token("build_id", request.build_id, max_len=MAX_ID)
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        v.raise_if_any()
        changed = await builds.set_run_build(self.pool, current_principal(), run_id, build_id, reason)
        return scheduler_pb2.SetRunBuildResponse(run=run_to_pb(changed.row))
