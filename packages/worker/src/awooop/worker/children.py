"""Child runs (docs/worker-sdk.md, "Child runs"): `ctx.start_child` and `ctx.run_children`.

A child is a run of the parent's project, started by StartChildRuns under the parent's lease
and identified by (parent run, step id): a parent run again from the top (after a crash, or
after it parked) asks for the same step ids and gets the same children back, never new ones.
The child run itself is the durable record of the start.

`run_children` starts its children and the wait over them in one call, then parks the parent
(WAITING_TOOL without a lease, as any durable wait) until they have all ended, or, fail fast,
until the first one that did not complete (its unfinished siblings are cancelled). The wait is
ended by the store in the transaction that ends the last child; the parent is claimed again,
runs from the top, and the same call then returns each child's outcome at once, read from the
children themselves.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import duration_pb2, timestamp_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import metrics, tracing
from awooop.worker.run_scope import RunScope
from awooop.worker.structs import from_struct, to_struct
from awooop.worker.waits import RunParked, WaitTimeout, WaitToken

# the statuses a child's outcome names (lowercase RunStatus names)
ENDED = ("completed", "failed", "cancelled")


@dataclass(frozen=True)
class Child:
    """A child run to start: its input and the usual run options. step_id names it within the
    parent (unique per parent); given or numbered in call order (`child-1`, ...), so a handler
    must start its children in the same order on every attempt, as it runs its steps."""

    input: Mapping[str, Any] = field(default_factory=dict)
    step_id: str | None = None
    priority: int = 0
    delay: float | None = None  # seconds before it may be claimed
    concurrency_keys: Sequence[str] = ()  # concurrency and rate keys, as CreateRun's
    max_attempts: int = 0  # 0: the project's retry policy
    # worker labels it requires and prefers (docs/flow-control.md); none of its parent's by default
    required_labels: Mapping[str, str] = field(default_factory=dict)
    preferred_labels: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ChildOutcome:
    """A child as the parent sees it: status is completed, failed or cancelled once it ended
    (or its current status, lowercased, for a sibling a fail-fast is still cancelling)."""

    step_id: str
    run_id: str
    status: str
    output: dict[str, Any]
    error: str = ""
    error_code: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "completed"

    @property
    def ended(self) -> bool:
        return self.status in ENDED


class ChildrenTimeout(WaitTimeout):
    """The children did not all end within run_children's timeout."""


@dataclass(frozen=True)
class ChildHandle:
    """A started child (ctx.start_child). `await handle.result()` parks the parent until it ended."""

    ctx: RunScope
    spec: scheduler_pb2.ChildRunSpec
    run_id: str
    step_id: str

    async def result(self, *, timeout: float | None = None) -> ChildOutcome:
        """The child's outcome; the parent parks until the child has ended."""
        wait_step_id = f"{self.step_id}:wait"
        with tracing.span(self.ctx.tracer, "awooop.worker.child_result", attributes={"awooop.step_id": wait_step_id}):
            outcomes = await _run(self.ctx, [self.spec], wait_step_id, False, timeout)
        return outcomes[0]


def _spec(c: Child, step_id: str) -> scheduler_pb2.ChildRunSpec:
    spec = scheduler_pb2.ChildRunSpec(
        step_id=step_id,
        input=to_struct(dict(c.input)),
        priority=c.priority,
        concurrency_keys=list(c.concurrency_keys),
        max_attempts=c.max_attempts,
        required_labels=dict(c.required_labels),
        preferred_labels=dict(c.preferred_labels),
    )
    if c.delay:
        when = timestamp_pb2.Timestamp()
        when.FromDatetime(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=c.delay))
        spec.not_before.CopyFrom(when)
    return spec


async def read_outcome(ctx: RunScope, c: scheduler_pb2.ChildRun) -> ChildOutcome:
    """A child of StartChildRuns' answer as the handler sees it (an omitted output read with GetRun)."""
    status = common_pb2.RunStatus.Name(c.status).removeprefix("RUN_STATUS_").lower()
    output = from_struct(c.output) if c.HasField("output") else {}
    if c.output_omitted:  # it did not fit StartChildRuns' answer: read the child itself
        got = await ctx.client.call(ctx.client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=c.run_id))
        output = from_struct(got.run.output) if got.run.HasField("output") else {}
    return ChildOutcome(
        step_id=c.step_id,
        run_id=c.run_id,
        status=status,
        output=output,
        error=c.failure_reason,
        error_code=c.error_code,
    )


async def start(ctx: RunScope, child: Child, step_id: str) -> ChildHandle:
    await ctx._reach(step_id, common_pb2.STEP_TYPE_CALLBACK, ordered=False)
    spec = _spec(child, step_id)
    resp = await ctx.client.call(
        ctx.client.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=ctx.lease, children=[spec])
    )
    c = resp.children[0]
    if c.started:
        metrics.CHILDREN_STARTED.inc()
        await _journal_start(ctx, step_id, [c.run_id])
    return ChildHandle(ctx, spec, c.run_id, step_id)


async def run(
    ctx: RunScope, children: Sequence[tuple[Child, str]], wait_step_id: str, fail_fast: bool, timeout: float | None
) -> list[ChildOutcome]:
    await ctx._reach(wait_step_id, common_pb2.STEP_TYPE_CALLBACK, ordered=False)
    return await _run(ctx, [_spec(c, s) for c, s in children], wait_step_id, fail_fast, timeout, journal=True)


async def _journal_start(ctx: RunScope, step_id: str, run_ids: list[str]) -> None:
    """Journals that the parent started children here (a callback step, as a durable wait's
    creation is), so a replay of the parent knows its code went this far (replay.py)."""
    await ctx._record(
        saga_pb2.RecordStepRequest(
            lease=ctx.lease,
            step_id=step_id,
            step_type=common_pb2.STEP_TYPE_CALLBACK,
            result=to_struct({"children": run_ids}),
        )
    )


def _duration(seconds: float) -> duration_pb2.Duration:
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


async def _run(
    ctx: RunScope,
    specs: list[scheduler_pb2.ChildRunSpec],
    wait_step_id: str,
    fail_fast: bool,
    timeout: float | None,
    journal: bool = False,
) -> list[ChildOutcome]:
    request = scheduler_pb2.StartChildRunsRequest(
        lease=ctx.lease, children=specs, wait_step_id=wait_step_id, fail_fast=fail_fast
    )
    if timeout:
        request.timeout.CopyFrom(_duration(timeout))
    resp = await ctx.client.call(ctx.client.scheduler.StartChildRuns, request)
    started = sum(1 for c in resp.children if c.started)
    if started:
        metrics.CHILDREN_STARTED.inc(started)
        if journal:
            await _journal_start(ctx, wait_step_id, [c.run_id for c in resp.children])
    w = resp.wait
    token = WaitToken(w.wait_id, wait_step_id, w.expires_at.ToDatetime(dt.UTC))
    if w.status == scheduler_pb2.WAIT_STATUS_OPEN:
        async with ctx._ending("parked"):
            parked = await ctx.client.call(
                ctx.client.scheduler.AwaitWait, scheduler_pb2.AwaitWaitRequest(lease=ctx.lease, wait_id=w.wait_id)
            )
        if parked.parked:
            ctx.log.info("parked until %d children end (%s)", len(specs), wait_step_id)
            raise RunParked(wait_step_id)
        ctx.outcome = None  # the children ended meanwhile: the run is still ours
        w = parked.wait
        # read the children again: they ended after the first answer
        request.ClearField("wait_step_id")
        resp = await ctx.client.call(ctx.client.scheduler.StartChildRuns, request)
    if w.status == scheduler_pb2.WAIT_STATUS_TIMED_OUT:
        raise ChildrenTimeout(token)
    outcomes = [await read_outcome(ctx, c) for c in resp.children]
    ctx.actions[wait_step_id] = "children"
    for o in outcomes:
        if o.ended:
            metrics.CHILDREN_ENDED.labels(o.status).inc()
    return outcomes
