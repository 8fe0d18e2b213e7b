"""What each page shows, built from gRPC answers into plain values for the templates
(transport-free: the handlers in views.py fetch, these functions shape)."""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format

from awooop.cli import timeline
from awooop.cli.client import when
from awooop.cli.flow import error_text, next_tick_text
from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.structs import from_struct
from services.common.run_events import STREAM_CHECKPOINT

TIMELINE_PAGE = 200  # timeline entries per page of a run
STEPS_PAGE = 100  # journal steps per page of a run
MAX_JSON_CHARS = 20_000  # a payload longer than this is shown cut, with a note

STATUSES = [n.removeprefix("RUN_STATUS_") for n in common_pb2.RunStatus.keys() if n != "RUN_STATUS_UNSPECIFIED"]
CHANNELS = [
    n.removeprefix("CHANNEL_TYPE_").lower() for n in common_pb2.ChannelType.keys() if n != "CHANNEL_TYPE_UNSPECIFIED"
]
TERMINAL = {common_pb2.RUN_STATUS_COMPLETED, common_pb2.RUN_STATUS_FAILED, common_pb2.RUN_STATUS_CANCELLED}
# the page reads as prose, so its run fields do too
WEB_FIELDS = timeline.FieldStyle(
    gap=" ", lease_gap=", ", event_label="provider event", approval_label="approval question"
)


def pretty(value: Any) -> str:
    text = json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False)
    if len(text) > MAX_JSON_CHARS:
        return text[:MAX_JSON_CHARS] + f"\n… ({len(text) - MAX_JSON_CHARS} more characters not shown)"
    return text


def struct_text(msg: Any, name: str) -> str:
    return pretty(from_struct(getattr(msg, name))) if msg.HasField(name) else ""


def age(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    if s < 172800:
        return f"{s // 3600} h {s % 3600 // 60} min"
    return f"{s // 86400} days"


@dataclass
class RunRow:
    run_id: str
    status: str
    channel: str
    event: str
    attempts: str
    saga: str
    worker: str
    build: str  # the worker build the run is on ("" when none)
    created: str
    updated: str
    reason: str
    cancel_requested: bool
    step: str  # a child run's step id in its parent ("" for a root run)


def run_row(r: common_pb2.Run) -> RunRow:
    return RunRow(
        run_id=r.run_id,
        status=timeline.status_name(r.status),
        channel=timeline.channel_name(r.channel_type),
        event=r.provider_event_id,
        attempts=timeline.attempts_text(r, "/"),
        saga=timeline.saga_name(r.saga_status),
        worker=r.worker_id,
        build=r.build_id,
        created=when(r.created_at),
        updated=when(r.updated_at),
        reason=timeline.short(" ".join(x for x in (r.error_code, r.failure_reason) if x), 80),
        cancel_requested=r.cancel_requested,
        step=r.parent_step_id,
    )


@dataclass
class Overview:
    counts: list[tuple[str, int]]
    total: int
    oldest_claimable_age: str  # '' when none is claimable
    oldest_claimable_at: str
    partial: bool = False  # counted from the first children GetRun lists, not all of them


def overview(resp: scheduler_pb2.CountRunsResponse) -> Overview:
    counts = [(timeline.status_name(c.status), int(c.count)) for c in resp.counts]
    has_oldest = resp.HasField("oldest_claimable_created_at")
    return Overview(
        counts=counts,
        total=int(resp.total),
        oldest_claimable_age=age(resp.oldest_claimable_age.ToTimedelta().total_seconds()) if has_oldest else "",
        oldest_claimable_at=when(resp.oldest_claimable_created_at) if has_oldest else "",
    )


def children_overview(children: list[scheduler_pb2.ChildRunRef], more: bool) -> Overview:
    """The counts of a run's children by status (the runs list filtered to them), from GetRun's
    list of them: CountRuns counts a whole project. Statuses in the state machine's order, as
    CountRuns gives them; the oldest claimable run is the project's measure, so not shown."""
    tally: dict[str, int] = {}
    for c in children:
        name = timeline.status_name(c.status)
        tally[name] = tally.get(name, 0) + 1
    counts = [(name, tally[name]) for name in STATUSES if name in tally]
    return Overview(counts=counts, total=len(children), oldest_claimable_age="", oldest_claimable_at="", partial=more)


@dataclass
class StepView:
    seq: int
    step_id: str
    type: str
    status: str
    attempt: int
    tool: str
    params: str
    result: str
    compensation: str
    compensation_reason: str
    error: str
    started: str
    completed: str
    compensated: str
    resolved_by: str
    resolution_reason: str
    compensation_failed: bool
    skipped_later: bool  # finished by an earlier attempt than the run's latest: later attempts skip it


# a step in one of these was finished, so a later attempt's BeginStep answers SKIP for it
FINISHED = {
    common_pb2.STEP_STATUS_COMPLETED,
    common_pb2.STEP_STATUS_COMPENSATING,
    common_pb2.STEP_STATUS_COMPENSATED,
    common_pb2.STEP_STATUS_COMPENSATION_FAILED,
    common_pb2.STEP_STATUS_RESOLVED,
}


def step_view(s: common_pb2.SagaStep, run_attempt: int = 0) -> StepView:
    return StepView(
        seq=s.seq,
        step_id=s.step_id,
        type=timeline.step_type(s.step_type),
        status=timeline.step_status(s.status),
        attempt=s.attempt,
        tool=s.tool_id,
        params=struct_text(s, "tool_params"),
        result=struct_text(s, "result"),
        compensation=timeline.compensation_text(s),
        compensation_reason=s.compensation_cmd.reason if s.HasField("compensation_cmd") else "",
        error=s.error,
        started=when(s.started_at),
        completed=when(s.completed_at),
        compensated=when(s.compensated_at),
        resolved_by=s.resolved_by,
        resolution_reason=s.resolution_reason,
        compensation_failed=s.status == common_pb2.STEP_STATUS_COMPENSATION_FAILED,
        skipped_later=s.status in FINISHED and 0 < s.attempt < run_attempt,
    )


@dataclass
class Page:
    """One page of a long list: items, 1-based number, count of pages."""

    items: list[Any]
    number: int
    pages: int
    total: int


def paginate(items: list[Any], number: int, size: int) -> Page:
    pages = max(1, -(-len(items) // size))
    number = min(max(1, number), pages)
    return Page(items[(number - 1) * size : number * size], number, pages, len(items))


@dataclass
class WaitView:
    """An open durable wait of the run page, with its Complete and Expire forms."""

    wait_id: str
    step_id: str
    kind: str
    expires: str


@dataclass
class RunPage:
    run: common_pb2.Run
    fields: list[tuple[str, str]]
    waiting: str
    waiting_title: str  # a finished run is not waiting: what is left is its compensation
    input: str
    output: str
    timeline: Page
    steps: Page
    saga: str
    failed_steps: list[StepView]
    waiting_approval: bool
    terminal: bool
    refresh: bool  # compensation under way: the page reloads itself (a meta refresh; no script)
    trace_url: str
    problems: list[str] = field(default_factory=list)
    open_waits: list[WaitView] = field(default_factory=list)  # an unfinished run's, to end by hand
    progress: list[ProgressView] = field(default_factory=list)
    streams: list[StreamView] = field(default_factory=list)  # the run's streamed output (ctx.stream_token)
    streaming: bool = False  # an unfinished run that streams: the page reloads itself to show more


@dataclass
class StreamView:
    """One token stream of one attempt as the run page shows it: its text so far and its holes."""

    stream: str
    attempt: int
    text: str = ""
    tokens: int = 0
    gaps: list[str] = field(default_factory=list)


def stream_views(items: list[scheduler_pb2.WatchRunResponse]) -> tuple[list[StreamView], list[str]]:
    """The token items of a snapshot watch (checkpoints', then the live tail's) as texts per
    (stream, attempt), and the notices about the live channel."""
    views: dict[tuple[str, int], StreamView] = {}
    notices: list[str] = []
    for m in items:
        if m.HasField("token_batch"):
            b = m.token_batch
            v = views.setdefault((b.stream, b.attempt), StreamView(b.stream, b.attempt))
            v.text += "".join(b.tokens)
            v.tokens = b.first_seq + len(b.tokens) - 1
        elif m.HasField("token_gap"):
            g = m.token_gap
            v = views.setdefault((g.stream, g.attempt), StreamView(g.stream, g.attempt))
            v.text += f"[... tokens {g.from_seq}..{g.to_seq} not available live ...]"
            v.gaps.append(f"tokens {g.from_seq}..{g.to_seq} ({g.reason}): in the next checkpoint")
        elif m.HasField("token_channel") and not m.token_channel.live:
            notices.append(m.token_channel.message)
    return list(views.values()), notices


@dataclass(frozen=True)
class ProgressView:
    """One progress event (ctx.emit) as the run page lists it."""

    offset: int
    at: str
    attempt: int
    kind: str
    data: str


def _undoing(run: common_pb2.Run, steps: list[common_pb2.SagaStep]) -> bool:
    """Whether the run's undo is under way or about to start (the page refreshes itself)."""
    undo_pending = any(s.status == common_pb2.STEP_STATUS_COMPLETED and s.HasField("compensation_cmd") for s in steps)
    return run.saga_status == common_pb2.SAGA_STATUS_COMPENSATING or (
        run.status in (common_pb2.RUN_STATUS_FAILED, common_pb2.RUN_STATUS_CANCELLED)
        and run.saga_status == common_pb2.SAGA_STATUS_IN_PROGRESS
        and undo_pending
    )


def run_page(
    run: common_pb2.Run,
    history: list[scheduler_pb2.RunEvent],
    journal: saga_pb2.GetJournalResponse | None,
    *,
    now: float,
    timeline_page: int,
    steps_page: int,
    trace_url: str,
    problems: list[str],
    waits: list[scheduler_pb2.Wait] | None = None,
    progress: list[scheduler_pb2.WatchEvent] | None = None,
    waiting_for_build: bool = False,
    tokens: list[scheduler_pb2.WatchRunResponse] | None = None,
) -> RunPage:
    """Long because it composes every section of the run page from its calls' answers, one
    keyword each."""
    entries = timeline.build(history, journal)
    raw_steps = list(journal.steps) if journal is not None else []
    # views (pretty JSON of params and results) only for the page shown: a run may have 1,000 steps
    steps_page_raw = paginate(raw_steps, steps_page, STEPS_PAGE)
    steps = Page(
        [step_view(s, run.attempt_count) for s in steps_page_raw.items],
        steps_page_raw.number,
        steps_page_raw.pages,
        steps_page_raw.total,
    )
    f = timeline.run_fields(run, WEB_FIELDS, waiting_for_build=waiting_for_build)
    terminal = run.status in TERMINAL
    streams, notices = stream_views(tokens or [])
    return RunPage(
        run=run,
        fields=f,
        waiting=timeline.waiting_reason(run, now, waiting_for_build=waiting_for_build),
        waiting_title="Compensation" if terminal else "Why it is waiting",
        input=struct_text(run, "input"),
        output=struct_text(run, "output"),
        timeline=paginate(entries, timeline_page, TIMELINE_PAGE),
        steps=steps,
        saga=timeline.saga_name(run.saga_status),
        failed_steps=[
            step_view(s, run.attempt_count) for s in raw_steps if s.status == common_pb2.STEP_STATUS_COMPENSATION_FAILED
        ],
        waiting_approval=run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL,
        terminal=terminal,
        open_waits=[] if terminal else [wait_view(w) for w in waits or [] if w.status == OPEN_WAIT],
        refresh=_undoing(run, raw_steps),
        trace_url=trace_url.replace("{run_id}", run.run_id) if trace_url else "",
        problems=problems + notices,
        streams=streams,
        streaming=bool(streams) and not terminal,
        progress=[
            ProgressView(
                e.offset,
                when(e.at),
                e.attempt,
                e.kind or "-",
                json.dumps(json_format.MessageToDict(e.data), ensure_ascii=False, sort_keys=True),
            )
            for e in progress or []
            if e.kind != STREAM_CHECKPOINT  # shown as the streamed output
        ],
    )


INVALID_LINK = (
    "This approval link's token is not the run's: it was mistyped or cut short, or the run asked again "
    "with a new link. Nothing was decided."
)
EXPIRED_LINK = "This approval link expired: nobody decided in time, so the run failed (E-APPROVAL-002)."


def approval_state(run: common_pb2.Run, now: float) -> tuple[str, str]:
    """(state, sentence) of an approval link's run: "open" (decide it), "expired", "decided"
    or "gone" (the run moved on some other way)."""
    if run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL:
        if run.HasField("approval_expires_at") and run.approval_expires_at.seconds <= now:
            return "expired", f"This approval link expired at {when(run.approval_expires_at)}."
        return "open", ""
    if run.error_code == "E-APPROVAL-002":
        return "expired", EXPIRED_LINK
    if run.approval_decided_by:
        verb = "rejected" if run.error_code == "E-APPROVAL-REJECTED" else "approved"
        return "decided", f"This approval link was already used: {run.approval_decided_by} {verb} the run."
    return "gone", f"This run is not waiting for approval any more (it is {timeline.status_name(run.status)})."


def parse_time(value: str) -> dt.datetime | None:
    """A form's date or date-time (UTC; `2026-12-01`, `2026-12-01T07:00`, ISO 8601); None if empty."""
    value = value.strip()
    if not value:
        return None
    parsed = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))  # ValueError: the caller says so
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.UTC)


OPEN_WAIT = scheduler_pb2.WAIT_STATUS_OPEN


def wait_view(w: scheduler_pb2.Wait) -> WaitView:
    kind = scheduler_pb2.WaitKind.Name(w.kind).removeprefix("WAIT_KIND_").lower()
    return WaitView(w.wait_id, w.step_id, kind, when(w.expires_at))


@dataclass
class ScheduleRow:
    name: str
    cron: str
    time_zone: str
    next_tick: str
    error: str  # "" when the last tick fired
    input: str


@dataclass
class WorkerRow:
    worker_id: str
    live: bool
    labels: str  # key=value,key=value ("" none)
    build: str
    first_seen: str
    last_seen: str


def worker_row(w: scheduler_pb2.Worker) -> WorkerRow:
    """A worker of the project as `awooop workers list` shows it."""
    return WorkerRow(
        worker_id=w.worker_id,
        live=w.live,
        labels=timeline.label_words(w.labels),
        build=w.build_id,
        first_seen=when(w.first_seen_at),
        last_seen=when(w.last_seen_at),
    )


def schedule_row(s: scheduler_pb2.Schedule) -> ScheduleRow:
    return ScheduleRow(
        name=s.name,
        cron=s.cron,
        time_zone=s.time_zone or "UTC",
        next_tick=next_tick_text(s),
        error=error_text(s) if s.last_error else "",
        input=struct_text(s, "input"),
    )
