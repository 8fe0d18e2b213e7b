"""The run reads (GetRun, ListRuns, CountRuns, ListProjects, GetRunHistory): validate, check the
caller's membership, call reads / overview / children, build the answer within the message limit."""

from __future__ import annotations

import datetime as dt

import asyncpg
import grpc

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from services.common import errors, run_options
from services.common.access import require_member
from services.common.auth import current_principal
from services.common.limits import MAX_ID, MAX_PROVIDER_EVENT_ID
from services.common.run_options import WaitReason
from services.common.runs import (
    channel_from_pb,
    run_to_pb,
    set_attempts_used,
    set_run_tree,
    set_time,
    status_from_pb,
    status_to_pb,
    ts,
)
from services.common.runstate import CLAIMABLE, TERMINAL, RunStatus
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import budget, builds, children, overview, reads
from services.scheduler.rpc_fields import status_of

MAX_PAGE_SIZE = 500
DEFAULT_PAGE_SIZE = 50


class ReadRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self._budget = budget.answer_budget(settings.max_message_bytes)

    async def get_run(self, request: scheduler_pb2.GetRunRequest) -> scheduler_pb2.GetRunResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        row = await reads.get_run(self.pool, current_principal(), run_id)
        run = run_to_pb(row)
        set_run_tree(run, row)
        set_attempts_used(run, row)
        kids = await children.children_of(self.pool, run_id)
        refs = [
            scheduler_pb2.ChildRunRef(
                run_id=str(k["run_id"]),
                step_id=k["parent_step_id"],
                status=status_of(k["status"]),  # type: ignore[arg-type]
            )
            for k in kids[: children.MAX_LISTED]
        ]
        fit = budget.fit_refs(refs, budget.answer_budget(self.settings.max_message_bytes) - run.ByteSize())
        more = fit < len(refs) or len(kids) > children.MAX_LISTED
        queued = row["status"] in CLAIMABLE and row["build_id"] is not None and row["wait_reason"] != WaitReason.HELD
        waiting = queued and await builds.waiting_for_build(self.pool, run_id, self.settings.build_live_seconds)
        return scheduler_pb2.GetRunResponse(run=run, children=refs[:fit], more_children=more, waiting_for_build=waiting)

    async def list_runs(self, request: scheduler_pb2.ListRunsRequest) -> scheduler_pb2.ListRunsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        statuses = []
        for i, s in enumerate(request.statuses):
            if v.check(s in common_pb2.RunStatus.values() and s != 0, f"statuses[{i}]", "unknown or UNSPECIFIED"):
                statuses.append(status_from_pb(s))
        page_size = v.int_range("page_size", request.page_size, 1, MAX_PAGE_SIZE, default=DEFAULT_PAGE_SIZE)
        channels = []
        for i, c in enumerate(request.channel_types):
            known = c in common_pb2.ChannelType.values() and c != 0
            if v.check(known, f"channel_types[{i}]", "unknown or UNSPECIFIED"):
                channels.append(channel_from_pb(c))
        sagas = []
        for i, g in enumerate(request.saga_statuses):
            if v.check(g in common_pb2.SagaStatus.values() and g != 0, f"saga_statuses[{i}]", "unknown or UNSPECIFIED"):
                sagas.append(common_pb2.SagaStatus.Name(g).removeprefix("SAGA_STATUS_").lower())
        event_id = v.text("provider_event_id", request.provider_event_id, max_len=MAX_PROVIDER_EVENT_ID)
        parent = v.uuid("parent_run_id", request.parent_run_id) if request.parent_run_id else ""
        build = v.token("build_id", request.build_id, max_len=MAX_ID, required=False)
        # (nanos out of range: a violation, not an exception)
        after_time = run_options.timestamp(v, "created_after", request.created_after)
        before_time = run_options.timestamp(v, "created_before", request.created_before)
        after = None
        if request.page_token:
            after = reads.decode_page_token(request.page_token)
            v.check(after is not None, "page_token", "not a token returned by ListRuns")
        v.raise_if_any()
        require_member(current_principal(), project_id)
        where = reads.RunFilter(
            statuses=sorted(set(statuses)) or None,
            channels=sorted(set(channels)) or None,
            created_after=after_time if request.HasField("created_after") else None,
            created_before=before_time if request.HasField("created_before") else None,
            provider_event_id=event_id or None,
            saga_statuses=sorted(set(sagas)) or None,
            parent_run_id=parent or None,
            build_id=build or None,
        )
        rows, next_token = await reads.list_runs(self.pool, project_id, where, page_size, after)
        runs = [run_to_pb(r) for r in rows]
        for run, r in zip(runs, rows, strict=True):
            set_run_tree(run, r)
            set_attempts_used(run, r)
        n = budget.fit_runs(runs, self._budget)
        if n < len(runs):  # the page ends at the last run that fits; the next one starts after it
            runs, next_token = runs[:n], reads.encode_page_token(rows[n - 1]["created_at"], rows[n - 1]["run_id"])
        return scheduler_pb2.ListRunsResponse(runs=runs, next_page_token=next_token)

    async def count_runs(self, request: scheduler_pb2.CountRunsRequest) -> scheduler_pb2.CountRunsResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        counts = await overview.count_runs(self.pool, project_id, request.include_finished)
        resp = scheduler_pb2.CountRunsResponse(
            counts=[
                scheduler_pb2.StatusCount(
                    status=status_to_pb(s.value),
                    count=counts.by_status.get(s.value, 0),
                )
                for s in RunStatus
                if request.include_finished or s not in TERMINAL
            ],
            total=sum(counts.by_status.values()),
            claimable=counts.claimable,
        )
        if counts.oldest_claimable is not None and counts.db_now is not None:
            set_time(resp.oldest_claimable_created_at, counts.oldest_claimable)
            resp.oldest_claimable_age.FromTimedelta(max(counts.db_now - counts.oldest_claimable, dt.timedelta(0)))
        return resp

    async def list_projects(self, request: scheduler_pb2.ListProjectsRequest) -> scheduler_pb2.ListProjectsResponse:
        projects, everything = await overview.list_projects(self.pool, current_principal())
        return scheduler_pb2.ListProjectsResponse(project_ids=projects, all_projects=everything)

    async def get_run_history(self, request: scheduler_pb2.GetRunHistoryRequest) -> scheduler_pb2.GetRunHistoryResponse:
        v = Violations()
        run_id = v.uuid("run_id", request.run_id)
        v.raise_if_any()
        rows = await reads.history(self.pool, current_principal(), run_id)
        resp = scheduler_pb2.GetRunHistoryResponse(
            events=[
                scheduler_pb2.RunEvent(
                    at=ts(r["created_at"]),
                    action=r["action"] or "",  # history() keeps only rows with an action
                    from_status=status_of(r["from_status"]),  # type: ignore[arg-type]
                    to_status=status_of(r["to_status"]),  # type: ignore[arg-type]
                    actor=r["actor"] or "",
                    reason=r["reason"] or "",
                    details=to_struct(r["details"] if isinstance(r["details"], dict) else {}),
                )
                for r in rows
            ]
        )
        size = resp.ByteSize()
        if size > self._budget:  # a clear answer, not a transport failure (as GetJournal's JOURNAL_TOO_LARGE)
            raise errors.ServiceError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                budget.HISTORY_TOO_LARGE,
                f"the history of run {run_id} is larger than AWOOOP_MAX_MESSAGE_BYTES; read awooop_audit_log directly",
                metadata={"run_id": run_id, "bytes": str(size)},
            )
        return resp
