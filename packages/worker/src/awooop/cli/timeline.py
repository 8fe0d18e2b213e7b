"""A run's state history (GetRunHistory) and journal (GetJournal) as one timeline, oldest first.

Both `awooop runs show` (text) and the operator console (HTML) render these entries, so what a
timeline contains is defined here once; each renderer only decides how it looks.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from google.protobuf import timestamp_pb2

from awooop.cli.client import enum_name, when
from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.structs import from_struct

# audit details that repeat what the timeline line already says
HIDDEN_DETAILS = ("lease_until", "expires_at")

# A durable sleep ends when its time is up: its normal end, not a wait that timed out. The audit
# log records it as any wait's timeout (WAIT_TIMED_OUT, or WAIT_ENDED when the run was not parked
# on it yet; details kind=sleep, outcome=timed_out), so the label is chosen here, for every renderer.
SLEEP_ENDED = "SLEEP_ENDED"
_SLEEP_KIND = "sleep"
_WAIT_TIMEOUTS = ("WAIT_TIMED_OUT", "WAIT_ENDED")


def status_name(value: int) -> str:
    return str(enum_name(common_pb2.RunStatus, value, "RUN_STATUS_"))


def saga_name(value: int) -> str:
    return str(enum_name(common_pb2.SagaStatus, value, "SAGA_STATUS_")).lower()


def channel_name(value: int) -> str:
    return str(enum_name(common_pb2.ChannelType, value, "CHANNEL_TYPE_")).lower()


def step_status(value: int) -> str:
    return str(enum_name(common_pb2.StepStatus, value, "STEP_STATUS_")).lower()


def step_type(value: int) -> str:
    return str(enum_name(common_pb2.StepType, value, "STEP_TYPE_")).lower()


def dumps(value: Any) -> str:
    """Compact, key-sorted JSON: how payloads, params and results are shown."""
    return json.dumps(value, sort_keys=True)


def short(text: str, n: int) -> str:
    text = text.replace("\n", " ")
    return text if len(text) <= n else text[: n - 1] + "…"


@dataclass(frozen=True)
class FieldStyle:
    """How a renderer words the run's fields: the gap before a remark, and two labels."""

    gap: str
    lease_gap: str
    event_label: str
    approval_label: str


# `awooop runs show` aligns columns, so remarks stand two spaces off
TERMINAL = FieldStyle(gap="  ", lease_gap="  ", event_label="event", approval_label="approval")


# Run.wait_reason -> what it means for the operator
WAIT_REASONS = {
    "backoff": "retry backoff until {t} (after a retryable failure or a reaped lease)",
    "delayed": "delayed: not claimable before {t} (not_before)",
    "key_busy": "concurrency key {key} is at its limit; claimable when a run with it finishes",
    "rate_limited": "key {key} started its rate's worth in this window; claimable from {t}",
    "debounce": "debouncing: gathering its key's events until {t} (each new one pushes that out, up to the"
    " rule's max wait); `awooop flow debounces` shows the rule",
    "held": "held: its worker's code did not replay its journal; `awooop runs unhold` after deploying code"
    " that does, or `awooop runs cancel` (compensates)",
    "labels": "no live worker has the labels it requires ({labels}); claimable when one claims (`awooop workers list`)",
}


# Run.wait_reason of a run parked on a durable wait (WAITING_TOOL, no lease) -> what it waits for
PARKED = {
    "wait_token": "parked on a wait token: resumes when CompleteWait or its callback URL answers",
    "wait_sleep": "sleeping (a durable sleep)",
    "wait_event": "parked until a matching channel event arrives",
    "wait_children": "parked until its child runs end",
}


def attempts_text(run: common_pb2.Run, sep: str = " of ") -> str:
    """The attempts that count against max_attempts (Run.attempts_used: failures and reaped
    leases, the current claim while leased), "N of M"; "?" for N from a server that does not send
    it. Not attempt_count, the lease generation, which every claim and every park raises."""
    used = str(run.attempts_used) if run.HasField("attempts_used") else "?"
    return f"{used}{sep}{run.max_attempts}"


def waiting_why(run: common_pb2.Run) -> str:
    """Why a queued run is not being claimed (its wait_reason, with its time or key), or what a
    run parked on a durable wait waits for (with its expiry), or ""."""
    if run.status == common_pb2.RUN_STATUS_WAITING_TOOL and run.wait_reason in PARKED:
        until = f" until {when(run.not_before)}" if run.HasField("not_before") else ""
        return f"{PARKED[run.wait_reason]}{until}"
    if run.status not in (common_pb2.RUN_STATUS_PENDING, common_pb2.RUN_STATUS_RESUMED):
        return ""
    text = WAIT_REASONS.get(run.wait_reason)
    if text is None:
        return f"{run.wait_reason} until {when(run.not_before)}" if run.wait_reason else ""
    # wait_key: the key it waits on; a server older than several keys per run sends only the one
    return text.format(
        t=when(run.not_before), key=run.wait_key or run.concurrency_key, labels=label_words(run.required_labels)
    )


def label_words(labels: Mapping[str, str]) -> str:
    """key=value,key=value (the form AWOOOP_WORKER_LABELS and the CLI's flags take)."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


def waiting_for_build_text(run: common_pb2.Run) -> str:
    """Why a queued run pinned to a build no live worker runs is not claimed (GetRunResponse.waiting_for_build)."""
    return (
        f"pinned to build {run.build_id}, which no live worker runs: it waits for one"
        " (`awooop builds list`; `awooop runs move` puts it on another build)"
    )


def build_text(run: common_pb2.Run) -> str:
    """The run's build and its own routing ("" when it has no build)."""
    if not run.build_id:
        return ""
    own = {common_pb2.VERSIONING_PINNED: " (pinned)", common_pb2.VERSIONING_AUTO_UPGRADE: " (auto-upgrade)"}
    return run.build_id + own.get(run.versioning, "")


def run_fields(
    run: common_pb2.Run, style: FieldStyle = TERMINAL, *, waiting_for_build: bool = False
) -> list[tuple[str, str]]:
    """The run's state as (label, value) rows: which facts a run view shows, and when, is
    decided here once for the CLI and the console. waiting_for_build: GetRunResponse's."""
    rows: list[tuple[str, str]] = [
        ("project", run.project_id),
        ("channel", channel_name(run.channel_type)),
        (style.event_label, run.provider_event_id or "-"),
        ("status", status_name(run.status) + (f"{style.gap}(cancel requested)" if run.cancel_requested else "")),
        ("attempts", attempts_text(run)),
    ]
    if run.attempt_count:  # the `attempt` the timeline, the journal and the run's events name
        rows.append(("lease generation", str(run.attempt_count)))
    if run.parent_run_id:  # a child run: its place in the run tree
        rows.append(("parent", f"{run.parent_run_id}{style.gap}(step {run.parent_step_id}, depth {run.child_depth})"))
    if run.priority:
        rows.append(("priority", str(run.priority)))
    keys = list(run.concurrency_keys) or ([run.concurrency_key] if run.concurrency_key else [])
    if keys:
        rows.append(("concurrency keys" if len(keys) > 1 else "concurrency key", ", ".join(keys)))
    if run.build_id:
        rows.append(("build", build_text(run)))
    if run.required_labels:
        rows.append(("requires labels", label_words(run.required_labels)))
    if run.preferred_labels:
        rows.append(("prefers labels", label_words(run.preferred_labels)))
    if run.sticky_worker:  # parked on a wait or an approval: its resume prefers this worker
        rows.append(("resumes on", f"{run.sticky_worker}{style.gap}(preferred for a while after it resumes)"))
    waiting = waiting_for_build_text(run) if waiting_for_build else waiting_why(run)
    if waiting:
        rows.append(("waiting", waiting))
    if run.worker_id:
        rows.append(("worker", f"{run.worker_id}{style.lease_gap}lease until {when(run.lease_until)}"))
    if run.failure_reason or run.error_code:
        rows.append(("failure", " ".join(x for x in (run.error_code, run.failure_reason) if x)))
    if run.approval_summary:
        rows.append((style.approval_label, run.approval_summary))
    if run.HasField("approval_expires_at") and run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL:
        rows.append(("approval expires", when(run.approval_expires_at)))  # a decided token expires no more
    if run.approval_decided_by:
        rows.append(("decided by", run.approval_decided_by))
    saga = saga_name(run.saga_status)
    if run.HasField("compensation_started_at"):
        started, ended = when(run.compensation_started_at), when(run.compensation_completed_at) or "?"
        saga += f"{style.gap}(compensation {started} .. {ended})"
    rows.append(("saga", saga))
    rows.append(("created", when(run.created_at)))
    rows.append(("updated", when(run.updated_at)))
    return rows


@dataclass(frozen=True)
class Entry:
    """One line of the timeline. kind is "run" (a state change from the audit log) or "step"
    (a journal event: begun, completed, failed, compensation)."""

    at: timestamp_pb2.Timestamp
    order: int  # ties on the same instant: history first, then step begin, end, compensation
    kind: str
    what: str  # the audit action, or the step label "#seq step_id (type, tool)"
    event: str = ""  # step entries: begun / completed / failed / compensation -> <status>
    move: str = ""  # run entries: "FROM -> TO"
    actor: str = ""
    reason: str = ""  # run entries' reason; step entries' error text
    details: str = ""  # run entries: key=value extras; compensation entries: the command run
    seq: int = 0  # step entries: the journal position (the console links to the step)

    @property
    def nanos(self) -> int:
        return int(self.at.ToNanoseconds())

    def text(self) -> str:
        """The entry as `awooop runs show` prints it."""
        if self.kind == "run":
            line = f"run   {self.what:<26} {self.move:<28} by {self.actor or '-'}"
            if self.reason:
                line += f"  {short(self.reason, 80)}"
            if self.details:
                line += f"  [{short(self.details, 100)}]"
            return line
        line = f"step  {self.what} {self.event}"
        if self.details:
            line += f"  ({self.details})"
        if self.reason:
            line += f": {short(self.reason, 80)}"
        return line


def step_label(s: common_pb2.SagaStep) -> str:
    return f"#{s.seq} {s.step_id} ({step_type(s.step_type)}{', ' + s.tool_id if s.tool_id else ''})"


def compensation_text(s: common_pb2.SagaStep) -> str:
    """The undo command of a step, e.g. `k8s_scale_deployment {"replicas": 1}`; '' when none."""
    if s.HasField("compensation_cmd") and s.compensation_cmd.tool_id:
        return f"{s.compensation_cmd.tool_id} {dumps(from_struct(s.compensation_cmd.params))}"
    return ""


def action_label(action: str, details: dict[str, Any]) -> str:
    """The timeline's name for an audit action: the action, but SLEEP_ENDED for a sleep's end."""
    if action in _WAIT_TIMEOUTS and details.get("kind") == _SLEEP_KIND and details.get("outcome") == "timed_out":
        return SLEEP_ENDED
    return action


def wait_status(w: scheduler_pb2.Wait) -> str:
    """A durable wait's status as the CLI lists it: open, completed or timed_out, and "ended" for
    a sleep whose time came (its normal end)."""
    if w.kind == scheduler_pb2.WAIT_KIND_SLEEP and w.status == scheduler_pb2.WAIT_STATUS_TIMED_OUT:
        return "ended"
    return str(enum_name(scheduler_pb2.WaitStatus, w.status, "WAIT_STATUS_")).lower()


def history_entries(history: list[scheduler_pb2.RunEvent]) -> list[Entry]:
    out = []
    for i, e in enumerate(history):
        move = ""
        if e.from_status or e.to_status:
            a = status_name(e.from_status) if e.from_status else ""
            move = f"{a} -> {status_name(e.to_status)}" if e.to_status else a
        details = from_struct(e.details)
        label = action_label(e.action, details)
        hidden = (*HIDDEN_DETAILS, "outcome") if label == SLEEP_ENDED else HIDDEN_DETAILS  # the label says it
        extra = " ".join(
            f"{k}={v if isinstance(v, str | int | float) else dumps(v)}"
            for k, v in details.items()
            if v not in (None, "", [], {}) and k not in hidden
        )
        out.append(Entry(e.at, i, "run", label, move=move, actor=e.actor, reason=e.reason, details=extra))
    return out


def journal_entries(journal: saga_pb2.GetJournalResponse | None) -> list[Entry]:
    out: list[Entry] = []
    for s in journal.steps if journal is not None else []:
        label = step_label(s)
        if s.HasField("started_at"):
            out.append(Entry(s.started_at, 10_000_000 + s.seq, "step", label, event="begun", seq=s.seq))
        if s.HasField("completed_at"):
            failed = s.status == common_pb2.STEP_STATUS_FAILED
            out.append(
                Entry(
                    s.completed_at,
                    20_000_000 + s.seq,
                    "step",
                    label,
                    event="failed" if failed else "completed",
                    reason=s.error if failed else "",
                    seq=s.seq,
                )
            )
        if s.HasField("compensated_at"):
            comp_failed = s.status == common_pb2.STEP_STATUS_COMPENSATION_FAILED
            out.append(
                Entry(
                    s.compensated_at,
                    30_000_000 + s.seq,
                    "step",
                    label,
                    event=f"compensation -> {step_status(s.status)}",
                    details=compensation_text(s),
                    reason=s.error if comp_failed else "",
                    actor=s.resolved_by,
                    seq=s.seq,
                )
            )
    return out


def build(history: list[scheduler_pb2.RunEvent], journal: saga_pb2.GetJournalResponse | None) -> list[Entry]:
    """History and journal merged, oldest first."""
    return sorted([*history_entries(history), *journal_entries(journal)], key=lambda e: (e.nanos, e.order))


def waiting_reason(run: common_pb2.Run, now: float, *, waiting_for_build: bool = False) -> str:
    """Why a run is not moving right now, in one sentence; '' for a finished or running run
    that needs nothing. now is the caller's clock in Unix seconds; waiting_for_build:
    GetRunResponse's."""
    status = run.status
    if waiting_for_build:
        return waiting_for_build_text(run)
    if status == common_pb2.RUN_STATUS_WAITING_APPROVAL:
        left = run.approval_expires_at.seconds - now if run.HasField("approval_expires_at") else 0
        text = "waiting for a human decision"
        if run.approval_summary:
            text += f" on: {run.approval_summary}"
        return text + (f" (token expires in {_span(left)})" if left > 0 else " (token expired; the sweep fails it)")
    if status == common_pb2.RUN_STATUS_WAITING_TOOL and run.wait_reason in PARKED:
        since = f"; parked since {when(run.updated_at)}" if run.HasField("updated_at") else ""
        return f"{waiting_why(run)}{since} (holds no worker)"
    if status == common_pb2.RUN_STATUS_WAITING_TOOL:
        return f"waiting on a tool call; worker {run.worker_id or '?'} holds the lease" + _lease_left(run, now)
    if status == common_pb2.RUN_STATUS_RUNNING:
        text = f"leased by worker {run.worker_id or '?'}" + _lease_left(run, now)
        return text + ("; cancel requested, stops at the next heartbeat" if run.cancel_requested else "")
    if status in (common_pb2.RUN_STATUS_PENDING, common_pb2.RUN_STATUS_RESUMED):
        if run.wait_reason:  # backoff, delayed, key busy, rate limited (docs/flow-control.md)
            return waiting_why(run)
        if run.HasField("not_before") and run.not_before.seconds > now:
            return f"in retry backoff: claimable in {_span(run.not_before.seconds - now)}"
        return f"claimable: waiting for a worker of project {run.project_id} to claim it"
    if run.saga_status == common_pb2.SAGA_STATUS_COMPENSATING:
        return "compensating: undo commands are running newest first"
    if run.saga_status == common_pb2.SAGA_STATUS_COMPENSATION_FAILED:
        return "a compensation failed: retry it or resolve it by hand"
    return ""


def _lease_left(run: common_pb2.Run, now: float) -> str:
    if not run.HasField("lease_until"):
        return ""
    left = run.lease_until.seconds - now
    return f", lease ends in {_span(left)}" if left > 0 else ", lease expired: the reaper takes it back"


def _span(seconds: float) -> str:
    s = max(0, int(seconds))
    if s < 120:
        return f"{s} s"
    if s < 7200:
        return f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"
