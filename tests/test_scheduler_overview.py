"""CountRuns, ListProjects and ListRuns' channel/time/provider-event/parent filters (the reads
behind the operator console's runs page), against a real scheduler and Postgres."""

from __future__ import annotations

import datetime as dt
import uuid
from typing import Any

import grpc
import pytest_asyncio
from google.protobuf import timestamp_pb2

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import errors
from tests.harness.helpers import expect_error
from tests.harness.scheduler import Sched, insert_runs, make_sched


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services: Any, channels: Any, db: Any, make_key: Any) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


def stamp(value: dt.datetime) -> timestamp_pb2.Timestamp:
    t = timestamp_pb2.Timestamp()
    t.FromDatetime(value)
    return t


async def test_count_runs_per_status_and_the_oldest_claimable_age(s: Sched) -> None:
    empty = await s.stub.CountRuns(pb.CountRunsRequest(project_id="p"), metadata=s.approver)
    assert empty.total == 0 and not empty.HasField("oldest_claimable_created_at")
    # the unfinished statuses (PENDING .. RESUMED), zeros included; finished ones when asked
    assert [c.status for c in empty.counts] == list(range(1, 6)) and all(c.count == 0 for c in empty.counts)
    every = await s.stub.CountRuns(pb.CountRunsRequest(project_id="p", include_finished=True), metadata=s.approver)
    assert [c.status for c in every.counts] == list(range(1, 9)) and all(c.count == 0 for c in every.counts)

    ids = await insert_runs(s.db, "p", 5)
    await insert_runs(s.db, "q", 3)
    await s.db.execute("UPDATE awooop_run_state SET created_at = now() - interval '1 hour' WHERE run_id = $1", ids[1])
    # a run in backoff is not claimable, however old
    await s.db.execute(
        "UPDATE awooop_run_state SET created_at = now() - interval '2 hours', not_before = now() + interval '1 hour'"
        " WHERE run_id = $1",
        ids[2],
    )
    await s.claim(max_runs=1)  # the oldest claimable (ids[1]) is now RUNNING
    resp = await s.stub.CountRuns(pb.CountRunsRequest(project_id="p"), metadata=s.approver)
    counts = {c.status: c.count for c in resp.counts}
    assert resp.total == 5 and resp.claimable == 3
    assert counts[common_pb2.RUN_STATUS_PENDING] == 4 and counts[common_pb2.RUN_STATUS_RUNNING] == 1
    oldest = await s.db.fetchval("SELECT created_at FROM awooop_run_state WHERE run_id = $1", ids[0])
    assert resp.oldest_claimable_created_at.ToDatetime(dt.UTC) == oldest
    assert 0 <= resp.oldest_claimable_age.ToTimedelta().total_seconds() < 3600

    await expect_error(
        s.stub.CountRuns(pb.CountRunsRequest(project_id="p"), metadata=s.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
    await expect_error(
        s.stub.CountRuns(pb.CountRunsRequest(project_id=""), metadata=s.approver),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )


async def test_list_projects_names_the_callers_projects(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    sched = await make_sched(start_services, channels, db, make_key)
    await insert_runs(db, "p", 1)
    await insert_runs(db, "q", 1)
    await insert_runs(db, "zeta", 2)
    resp = await sched.stub.ListProjects(pb.ListProjectsRequest(), metadata=sched.approver)
    assert list(resp.project_ids) == ["p"] and not resp.all_projects
    everyone = await make_key("ops", {"*": ["admin"]})
    resp = await sched.stub.ListProjects(pb.ListProjectsRequest(), metadata=everyone)
    assert list(resp.project_ids) == ["p", "q", "zeta"] and resp.all_projects


async def test_list_runs_filters_by_channel_time_and_provider_event(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 4)
    await s.db.execute(
        "UPDATE awooop_run_state SET channel_type = 'telegram', provider_event_id = '1001' WHERE run_id = $1", ids[0]
    )
    await s.db.execute("UPDATE awooop_run_state SET created_at = now() - interval '3 days' WHERE run_id = $1", ids[1])

    async def listed(**kw: Any) -> list[str]:
        resp = await s.stub.ListRuns(pb.ListRunsRequest(project_id="p", **kw), metadata=s.approver)
        return [r.run_id for r in resp.runs]

    assert await listed(channel_types=[common_pb2.CHANNEL_TYPE_TELEGRAM]) == [ids[0]]
    assert await listed(provider_event_id="1001") == [ids[0]]
    assert await listed(provider_event_id="nope") == []
    day_ago = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
    assert ids[1] not in await listed(created_after=stamp(day_ago))
    assert await listed(created_before=stamp(day_ago)) == [ids[1]]
    # the filters hold across pages
    first = await s.stub.ListRuns(
        pb.ListRunsRequest(project_id="p", page_size=1, channel_types=[common_pb2.CHANNEL_TYPE_API]),
        metadata=s.approver,
    )
    second = await s.stub.ListRuns(
        pb.ListRunsRequest(
            project_id="p", page_size=5, channel_types=[common_pb2.CHANNEL_TYPE_API], page_token=first.next_page_token
        ),
        metadata=s.approver,
    )
    assert [r.run_id for r in [*first.runs, *second.runs]] == [ids[3], ids[2], ids[1]]
    err = await expect_error(
        s.stub.ListRuns(pb.ListRunsRequest(project_id="p", channel_types=[0]), metadata=s.approver),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    assert errors.bad_request(err).field_violations[0].field == "channel_types[0]"  # type: ignore[union-attr]
    # a timestamp that is none (nanos out of range) is named, not an INTERNAL
    bad = timestamp_pb2.Timestamp(seconds=0, nanos=-1)
    err = await expect_error(
        s.stub.ListRuns(pb.ListRunsRequest(project_id="p", created_after=bad), metadata=s.approver),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )
    violations = errors.bad_request(err).field_violations  # type: ignore[union-attr]
    assert [(v.field, v.description) for v in violations] == [("created_after", "not a valid timestamp")]


async def test_list_runs_filters_by_saga_status(s: Sched) -> None:
    ids = await insert_runs(s.db, "p", 3)
    await s.db.execute(
        "UPDATE awooop_run_state SET status = 'FAILED', saga_status = 'compensation_failed' WHERE run_id = $1", ids[1]
    )
    resp = await s.stub.ListRuns(
        pb.ListRunsRequest(project_id="p", saga_statuses=[common_pb2.SAGA_STATUS_COMPENSATION_FAILED]),
        metadata=s.approver,
    )
    assert [r.run_id for r in resp.runs] == [ids[1]]
    await expect_error(
        s.stub.ListRuns(pb.ListRunsRequest(project_id="p", saga_statuses=[99]), metadata=s.approver),
        grpc.StatusCode.INVALID_ARGUMENT,
        errors.FIELD_INVALID,
    )


async def test_list_runs_filters_by_parent(s: Sched) -> None:
    """A run's children, newest first, paged, with the other filters; a run without children
    lists none; another project's parent lists nothing in this one; a bad id is named."""
    parent, other_parent, _ = await insert_runs(s.db, "p", 3)
    [foreign] = await insert_runs(s.db, "q", 1)
    leases = {r.lease.run_id: r.lease for r in await s.claim(max_runs=3)}

    async def start(lease: common_pb2.LeaseToken, step_id: str) -> str:
        spec = pb.ChildRunSpec(step_id=step_id)
        resp = await s.stub.StartChildRuns(pb.StartChildRunsRequest(lease=lease, children=[spec]), metadata=s.worker)
        return resp.children[0].run_id

    kids = [await start(leases[parent], f"k{i}") for i in range(3)]  # one call each: three creation times
    [other_kid] = [await start(leases[other_parent], "k0")]

    async def listed(**kw: Any) -> list[str]:
        resp = await s.stub.ListRuns(pb.ListRunsRequest(project_id="p", **kw), metadata=s.approver)
        return [r.run_id for r in resp.runs]

    assert await listed(parent_run_id=parent) == kids[::-1]
    assert await listed(parent_run_id=other_parent) == [other_kid]
    assert await listed(parent_run_id=kids[0]) == []  # no children of its own
    assert await listed(parent_run_id=foreign) == []  # its project is q
    # each run says its step, and the other filters hold (one child claimed: RUNNING)
    resp = await s.stub.ListRuns(pb.ListRunsRequest(project_id="p", parent_run_id=parent), metadata=s.approver)
    assert [(r.parent_run_id, r.parent_step_id) for r in resp.runs] == [(parent, "k2"), (parent, "k1"), (parent, "k0")]
    await s.db.execute("UPDATE awooop_run_state SET priority = 9 WHERE run_id = $1", uuid.UUID(kids[1]))
    assert [r.lease.run_id for r in await s.claim(max_runs=1)] == [kids[1]]
    assert await listed(parent_run_id=parent, statuses=[common_pb2.RUN_STATUS_RUNNING]) == [kids[1]]
    # pages: the same filter with the token
    first = await s.stub.ListRuns(
        pb.ListRunsRequest(project_id="p", parent_run_id=parent, page_size=2), metadata=s.approver
    )
    second = await s.stub.ListRuns(
        pb.ListRunsRequest(project_id="p", parent_run_id=parent, page_size=2, page_token=first.next_page_token),
        metadata=s.approver,
    )
    assert [r.run_id for r in [*first.runs, *second.runs]] == kids[::-1] and not second.next_page_token
    # the project's own list is unchanged: every run, children too
    assert set(kids) | {parent, other_parent, other_kid} <= set(await listed(page_size=50))
    for bad in ("not-a-uuid", f"{parent}x"):
        err = await expect_error(
            s.stub.ListRuns(pb.ListRunsRequest(project_id="p", parent_run_id=bad), metadata=s.approver),
            grpc.StatusCode.INVALID_ARGUMENT,
            errors.FIELD_INVALID,
        )
        violations = errors.bad_request(err).field_violations  # type: ignore[union-attr]
        assert [(v.field, v.description) for v in violations] == [("parent_run_id", "must be a UUID")]
    await expect_error(
        s.stub.ListRuns(pb.ListRunsRequest(project_id="p", parent_run_id=parent), metadata=s.outsider),
        grpc.StatusCode.PERMISSION_DENIED,
        errors.FORBIDDEN,
    )
