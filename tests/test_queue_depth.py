"""Queue depth from unfinished runs only: CountRuns (its claimable count and per-status counts)
and the queue gauges (QueueSampler's SampleQueue) against a store holding many projects with
runs in every status, finished ones among them, runs in backoff, parked behind a key, out of
attempts, and a paused project. Correctness only: bench/depth.py measures that the cost does not
follow the finished runs. Real scheduler over gRPC, real Postgres."""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest_asyncio
from prometheus_client import REGISTRY

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common.runstate import TERMINAL, RunStatus
from services.scheduler.queue import QueueSampler
from tests.harness.scheduler import Sched, make_sched

S = RunStatus

# RUNNING rows hold a lease (a worker), WAITING_TOOL ones are parked on durable waits (none)
# rows of one kind: (status, how many, not_before (SQL), attempts used of 3); claimable only
# when queued, due, with attempts left and the project not paused
SEED = """
INSERT INTO awooop_run_state (project_id, channel_type, input, status, not_before, attempt_count, max_attempts,
                              created_at, worker_id, lease_until)
SELECT $1, 'api', '{}'::jsonb, $2::text, $3::text::timestamptz, $4, 3, now() - make_interval(secs => $5 + g),
       CASE WHEN $2::text = 'RUNNING' THEN 'w' END, CASE WHEN $2::text = 'RUNNING' THEN now() + interval '1 hour' END
  FROM generate_series(1, $6) g
"""


@dataclass(frozen=True)
class Kind:
    status: RunStatus
    n: int
    not_before: str | None = None
    attempts: int = 0
    age: int = 0  # seconds before now of the kind's newest run (created_at = now() - age - g)

    @property
    def due(self) -> bool:
        return self.not_before is None or self.not_before == "-infinity"

    def claimable(self, paused: bool) -> int:
        queued = self.status in (S.PENDING, S.RESUMED)
        return self.n if queued and self.due and self.attempts < 3 and not paused else 0


KINDS = [
    Kind(S.PENDING, 7, age=100),
    Kind(S.PENDING, 2, not_before="infinity", age=5000),  # parked behind a busy key
    Kind(S.PENDING, 3, not_before="2999-01-01", age=6000),  # a retry backoff
    Kind(S.PENDING, 1, not_before="-infinity", age=50),  # delayed, now due
    Kind(S.RESUMED, 2, attempts=1, age=200),
    Kind(S.RESUMED, 1, attempts=3, age=9000),  # no attempts left: never claimed
    Kind(S.RUNNING, 4, attempts=1),
    Kind(S.WAITING_TOOL, 2, attempts=1),  # parked on durable waits (no worker)
    Kind(S.WAITING_APPROVAL, 3, attempts=1),
    Kind(S.COMPLETED, 40, attempts=1, age=99999),
    Kind(S.FAILED, 9, attempts=3, age=99999),
    Kind(S.CANCELLED, 5, age=99999),
]


async def seed(db: asyncpg.Connection, project: str, kinds: list[Kind]) -> None:
    for k in kinds:
        await db.execute(SEED, project, k.status.value, k.not_before, k.attempts, k.age, k.n)


def expected(kinds: list[Kind], paused: bool) -> tuple[dict[str, int], int, int | None]:
    """(count per status, claimable, age in seconds of the oldest claimable run's creation)."""
    counts = {s.value: 0 for s in S}
    for k in kinds:
        counts[k.status.value] += k.n
    claimable = [k for k in kinds if k.claimable(paused)]
    oldest = max((k.age + k.n for k in claimable), default=None)
    return counts, sum(k.claimable(paused) for k in claimable), oldest


@pytest_asyncio.fixture(loop_scope="session")
async def s(start_services: Any, channels: Any, db: Any, make_key: Any) -> Sched:
    return await make_sched(start_services, channels, db, make_key)


async def test_count_runs_and_queue_gauges_with_many_projects_live_finished_and_paused(s: Sched, make_key: Any) -> None:
    tag = uuid.uuid4().hex[:6]
    # projects: the full mix, one with only finished runs, one paused, one with one kind of each
    projects: dict[str, tuple[list[Kind], bool]] = {
        f"d{tag}-mix": (KINDS, False),
        f"d{tag}-done": ([k for k in KINDS if k.status in TERMINAL], False),
        f"d{tag}-paused": (KINDS, True),
    }
    for i, k in enumerate(KINDS):
        projects[f"d{tag}-k{i}"] = ([k], False)
    for p, (kinds, paused) in projects.items():
        await seed(s.db, p, kinds)
        if paused:
            await s.db.execute("INSERT INTO awooop_project_flow (project_id, paused) VALUES ($1, true)", p)
    md = await make_key(f"depth-{tag}", {p: ["approver"] for p in projects})

    for p, (kinds, paused) in projects.items():
        counts, claimable, oldest_age = expected(kinds, paused)
        live = {k: v for k, v in counts.items() if S(k) not in TERMINAL}

        resp = await s.stub.CountRuns(pb.CountRunsRequest(project_id=p), metadata=md)
        got = {common_pb2.RunStatus.Name(c.status).removeprefix("RUN_STATUS_"): c.count for c in resp.counts}
        assert got == live, p  # every unfinished status, zeros included; no finished one
        assert resp.total == sum(live.values()), p
        assert resp.claimable == claimable, p
        if oldest_age is None:
            assert not resp.HasField("oldest_claimable_created_at"), p
        else:
            age = resp.oldest_claimable_age.ToTimedelta().total_seconds()
            assert oldest_age <= age < oldest_age + 60, (p, age, oldest_age)

        every = await s.stub.CountRuns(pb.CountRunsRequest(project_id=p, include_finished=True), metadata=md)
        got = {common_pb2.RunStatus.Name(c.status).removeprefix("RUN_STATUS_"): c.count for c in every.counts}
        assert got == counts, p
        assert every.total == sum(counts.values()) and every.claimable == claimable, p

    # the gauges: one sample, every project's unfinished statuses and claimable count
    await QueueSampler(s.pool).sample()
    for p, (kinds, paused) in projects.items():
        counts, claimable, oldest_age = expected(kinds, paused)
        seen = REGISTRY.get_sample_value("awooop_scheduler_runs_claimable", {"project": p})
        if any(counts[st.value] for st in S if st not in TERMINAL):
            for status in (st for st in S if st not in TERMINAL):
                value = REGISTRY.get_sample_value("awooop_scheduler_runs", {"project": p, "status": status.value})
                assert value == counts[status.value], (p, status)
            assert seen == claimable, p
            age = REGISTRY.get_sample_value("awooop_scheduler_oldest_claimable_age_seconds", {"project": p})
            assert (age or 0) > 0 if claimable else age == 0, p
        else:
            # a project with only finished runs is not in the sample: no series, or 0
            assert not seen, p
        for status in TERMINAL:  # finished runs are never a gauge
            assert REGISTRY.get_sample_value("awooop_scheduler_runs", {"project": p, "status": status.value}) is None
