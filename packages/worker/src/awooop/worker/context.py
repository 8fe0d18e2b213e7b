"""RunContext: what a handler gets for one claimed run.

Journaled steps (seed ADR-119 D2): `await ctx.step(step_id, fn, ...)`. A step completed by an
earlier attempt is skipped and its recorded result returned; a step an earlier attempt left
pending (it may or may not have happened) runs again with the same idempotency key, so the tool
can recognise the repeat. Every call carries the lease's fencing token; once the lease is gone
every call raises LeaseLost and the worker stops the handler.

Tool calls are journaled twice: BeginStep before they run (the pending record a crash mid-call
leaves behind) and CompleteStep after. Steps without side effects (llm_call, callback) are
journaled once, after they ran, with RecordStep: a crash mid-step just runs them again. Which of
those an earlier attempt completed is read from the journal once per attempt (never on a run's
first attempt, whose journal is empty).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import inspect
import logging
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import duration_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import children, event_matches, metrics, tracing, waits
from awooop.worker.client import Client
from awooop.worker.completions import CompletionBatcher
from awooop.worker.errors import JOURNAL_TOO_LARGE, AwooopError, LeaseLost, RunFinished
from awooop.worker.replay import NONDETERMINISM_CODE, PATCH_PREFIX, Nondeterminism, ReplayCheck
from awooop.worker.run_scope import Json, StepCall
from awooop.worker.structs import from_struct, to_struct
from awooop.worker.tokens import DEFAULT_STREAM, TokenStreams
from awooop.worker.waits import WaitTimeout, WaitToken

log = logging.getLogger("awooop.worker")

STEP_TYPES = {
    "llm_call": common_pb2.STEP_TYPE_LLM_CALL,
    "tool_call": common_pb2.STEP_TYPE_TOOL_CALL,
    "approval_request": common_pb2.STEP_TYPE_APPROVAL_REQUEST,
    "callback": common_pb2.STEP_TYPE_CALLBACK,
}
ACTIONS = {
    saga_pb2.STEP_ACTION_EXECUTE: "execute",
    saga_pb2.STEP_ACTION_SKIP: "skip",
    saga_pb2.STEP_ACTION_RETRY: "retry",
}

# GetJournal's answer for a journal larger than the saga service's message limit
# step types journaled once, after they ran (RecordStep)
RECORDED_AFTER = ("llm_call", "callback")

# compensation: a command dict {"tool_id", "params", "reason"}, or a function of the step's result
# returning one (or None when there is nothing to undo)
Compensation = Mapping[str, Any] | Callable[[Json], Mapping[str, Any] | None] | None


@dataclass(frozen=True)
class Approval:
    """granted: the approver approved (the run was resumed), go on. Otherwise the approval was
    requested now: hand `token` to the approver and return; the run waits without a lease."""

    granted: bool
    token: str = ""
    expires_at: dt.datetime | None = None
    decided_by: str = ""


def _duration(seconds: float | None) -> duration_pb2.Duration | None:
    if not seconds:
        return None
    d = duration_pb2.Duration()
    d.FromNanoseconds(int(seconds * 1e9))
    return d


def _compensation_pb(cmd: Mapping[str, Any] | None) -> common_pb2.CompensationCommand | None:
    if not cmd:
        return None
    return common_pb2.CompensationCommand(
        tool_id=str(cmd["tool_id"]), params=to_struct(dict(cmd.get("params") or {})), reason=str(cmd.get("reason", ""))
    )


class RunContext:
    """One claimed run: its input, its lease, journaled steps and the run's end."""

    def __init__(
        self,
        client: Client,
        claimed: scheduler_pb2.ClaimedRun,
        worker_id: str,
        stopping: asyncio.Event | None = None,
        completions: CompletionBatcher | None = None,
        *,
        tracer: Any = None,
    ) -> None:
        self.client = client
        self.tracer = tracer  # OpenTelemetry tracer (None: off); each step is a span
        # W3C traceparent of the run's trace, from the claim (empty: the scheduler traced nothing)
        self.traceparent: str = claimed.traceparent
        # when the run became claimable (ns since the epoch; 0: not sent), for the claim's span
        since = claimed.claimable_since
        self.claimable_since_ns: int = since.ToNanoseconds() if claimed.HasField("claimable_since") else 0
        # the Worker's batcher (completions share CompleteRuns calls); None: one CompleteRun each
        self.completions = completions
        # set when the worker is shutting down: finish within its grace period or be released
        self.stopping = stopping or asyncio.Event()
        self.run: common_pb2.Run = claimed.run
        self.lease: common_pb2.LeaseToken = claimed.lease
        self.resumed: bool = claimed.resumed
        self.worker_id = worker_id
        self.input: Json = from_struct(claimed.run.input)
        # step_id -> "execute" | "skip" | "retry", in the order this attempt met them
        self.actions: dict[str, str] = {}
        self.outcome: str | None = None  # completed | failed | waiting_approval, once the run left our hands
        # the journal as this attempt knows it (step_id -> entry), for steps journaled after they
        # ran; None until read. A first attempt's journal is empty: nothing to read.
        self._journal: dict[str, common_pb2.SagaStep] | None = None if (self.attempt > 1 or self.resumed) else {}
        self._journal_too_large = False  # GetJournal answered JOURNAL_TOO_LARGE: use BeginStep instead
        # a resumed attempt's check of its calls against the journal it found (replay.py); None
        # until the journal is read, and on a first attempt (nothing to replay)
        self._replay: ReplayCheck | None = None
        # set once the handler's code was found not to replay the journal: the worker holds the run
        self.nondeterminism: Nondeterminism | None = None
        self._patches: dict[str, bool] = {}  # ctx.patched's answers in this attempt, by change id
        self._wait_numbers: dict[str, int] = {}  # durable waits' step ids numbered per kind, in call order
        self.log = logging.LoggerAdapter(log, {"run_id": self.run_id, "attempt": self.attempt})
        self.tokens = TokenStreams(self)  # ctx.stream_token's streams

    @property
    def run_id(self) -> str:
        return self.lease.run_id

    @property
    def project_id(self) -> str:
        return self.run.project_id

    @property
    def attempt(self) -> int:
        return self.lease.attempt

    @property
    def build_id(self) -> str:
        """The build this attempt runs on (the claiming worker's; "" when it declared none)."""
        return self.run.build_id

    @property
    def finished(self) -> bool:
        return self.outcome is not None

    def _live(self, what: str) -> None:
        if self.outcome is not None:
            raise RunFinished(f"{what}: run {self.run_id} already {self.outcome}; the handler should return")
        if self.nondeterminism is not None:  # the handler caught it and went on: it is still true
            raise self.nondeterminism

    async def _reach(
        self,
        step_id: str,
        kind: int,
        tool_id: str = "",
        params: Mapping[str, Any] | None = None,
        *,
        ordered: bool = True,
    ) -> None:
        """A journaling call of the handler, checked against the journal a resumed attempt found
        (replay.py; ordered False: the SDK's own entry of a wait or a fan-in). Raises
        Nondeterminism (and remembers it) when the code does not replay it."""
        if self._journal_too_large or (self._journal is not None and self._replay is None):
            return  # a first attempt (its journal is empty), or a journal too large to read whole
        await self._known(step_id)  # reads the journal once
        if self._replay is None:
            return  # too large to read whole: not checked (logged once)
        try:
            self._replay.reach(step_id, kind, tool_id, params, ordered=ordered)
        except Nondeterminism as exc:
            self.nondeterminism = exc
            raise

    def check_replayed(self) -> None:
        """Before the run completes: raises the Nondeterminism found earlier, if any (a handler
        that caught it must not complete the run)."""
        if self.nondeterminism is not None:
            raise self.nondeterminism

    # --- journaled steps ---

    async def step(
        self,
        step_id: str,
        fn: Callable[[StepCall], Any],
        *,
        step_type: str | None = None,
        tool_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        compensation: Compensation = None,
    ) -> Json:
        """Runs fn at most once per run (per step_id) and returns its result dict.

        fn(call: StepCall) may be sync or async and returns a dict (None means {}). step_type is
        llm_call, tool_call (the default when tool_id is given), approval_request or callback
        (the default otherwise). compensation undoes a completed tool_call if the run later
        fails, is rejected or cancelled: a dict {"tool_id", "params", "reason"} or a function of
        the result returning one. If fn raises, the step is journaled failed and the error re-raised.
        """
        attributes = {"awooop.step_id": step_id, "awooop.step_type": step_type or "", "awooop.tool_id": tool_id or ""}
        with tracing.span(self.tracer, "awooop.worker.step", attributes=attributes) as span:
            result = await self._step(
                step_id, fn, step_type=step_type, tool_id=tool_id, params=params, compensation=compensation
            )
            if span is not None:
                span.set_attribute("awooop.action", self.actions.get(step_id, ""))
            return result

    async def _step(
        self,
        step_id: str,
        fn: Callable[[StepCall], Any],
        *,
        step_type: str | None = None,
        tool_id: str | None = None,
        params: Mapping[str, Any] | None = None,
        compensation: Compensation = None,
    ) -> Json:
        """step without its span."""
        self._live(f"step {step_id}")
        kind = _step_kind(step_id, step_type, tool_id)
        args = dict(params or {})
        await self._reach(step_id, STEP_TYPES[kind], tool_id or "", args)
        if kind in RECORDED_AFTER and not tool_id and self.client.record_steps and not self._journal_too_large:
            known = await self._known(step_id)
            if not self._journal_too_large and (
                known is None or (known.step_type == STEP_TYPES[kind] and not known.tool_id)
            ):
                return await self._recorded_step(step_id, kind, fn, args, known)
            # journaled as another kind of step: BeginStep below answers why that is refused
            # (and a journal too large to read whole is asked about step by step, with BeginStep)
        begin = await self.client.call(
            self.client.saga.BeginStep,
            saga_pb2.BeginStepRequest(
                lease=self.lease,
                step_id=step_id,
                step_type=STEP_TYPES[kind],
                tool_id=tool_id or "",
                tool_params=to_struct(args) if (tool_id or args) else None,
            ),
        )
        action = ACTIONS.get(begin.action, "execute")
        self.actions[step_id] = action
        metrics.STEPS.labels(action).inc()
        if action == "skip":
            self.log.info("step %s skipped: completed by an earlier attempt", step_id)
            return from_struct(begin.step.result)
        call = StepCall(
            run_id=self.run_id,
            project_id=self.project_id,
            step_id=step_id,
            idempotency_key=begin.idempotency_key,
            tool_id=tool_id or "",
            params=args,
            attempt=self.attempt,
            retry=action == "retry",
        )
        result, cmd = await self._execute(call, fn, compensation)
        await self.client.call(
            self.client.saga.CompleteStep,
            saga_pb2.CompleteStepRequest(
                lease=self.lease, step_id=step_id, result=to_struct(result), compensation_cmd=_compensation_pb(cmd)
            ),
        )
        return result

    async def _execute(
        self, call: StepCall, fn: Callable[[StepCall], Any], compensation: Compensation
    ) -> tuple[Json, Mapping[str, Any] | None]:
        """Runs a step's function: its result and compensation command. If fn raises, the step
        is journaled failed (FailStep) and the error re-raised."""
        try:
            value = fn(call)
            if inspect.isawaitable(value):
                value = await value
            result = _as_result(value, call.step_id)
            return result, compensation(result) if callable(compensation) else compensation
        except (LeaseLost, RunFinished):
            raise
        except Exception as exc:
            # cancellation (BaseException) leaves the step pending on purpose: the next attempt retries it
            with contextlib.suppress(AwooopError):
                await self.client.call(
                    self.client.saga.FailStep,
                    saga_pb2.FailStepRequest(
                        lease=self.lease, step_id=call.step_id, error=f"{type(exc).__name__}: {exc}"[:4096]
                    ),
                )
            raise

    async def _known(self, step_id: str) -> common_pb2.SagaStep | None:
        """This step's journal entry from an earlier attempt, if any (the journal is read once)."""
        if self._journal is None:
            try:
                resp = await self.client.call(
                    self.client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=self.run_id)
                )
            except AwooopError as err:
                if err.reason != JOURNAL_TOO_LARGE:
                    raise
                self._journal_too_large = True
                self.log.warning("journal too large to read whole: this attempt's replay is not checked")
                return None
            self._journal = {s.step_id: s for s in resp.steps}
            self._replay = ReplayCheck(self.run_id, resp.steps)
        return self._journal.get(step_id)

    async def _recorded_step(
        self, step_id: str, kind: str, fn: Callable[[StepCall], Any], args: Json, known: common_pb2.SagaStep | None
    ) -> Json:
        """A step without side effects: skipped when completed, else run and journaled once (RecordStep)."""
        if known is not None and known.status == common_pb2.STEP_STATUS_COMPLETED:
            self.actions[step_id] = "skip"
            metrics.STEPS.labels("skip").inc()
            self.log.info("step %s skipped: completed by an earlier attempt", step_id)
            return from_struct(known.result)
        action = "retry" if known is not None else "execute"
        self.actions[step_id] = action
        metrics.STEPS.labels(action).inc()
        call = StepCall(
            run_id=self.run_id,
            project_id=self.project_id,
            step_id=step_id,
            idempotency_key=f"{self.run_id}:{step_id}",
            tool_id="",
            params=args,
            attempt=self.attempt,
            retry=action == "retry",
        )
        base = saga_pb2.RecordStepRequest(
            lease=self.lease, step_id=step_id, step_type=STEP_TYPES[kind], params=to_struct(args) if args else None
        )
        try:
            value = fn(call)
            if inspect.isawaitable(value):
                value = await value
            result = _as_result(value, step_id)
        except (LeaseLost, RunFinished):
            raise
        except Exception as exc:
            base.error = f"{type(exc).__name__}: {exc}"[:4096]
            with contextlib.suppress(AwooopError):
                await self._record(base)
            raise
        base.result.CopyFrom(to_struct(result))
        resp = await self._record(base)
        if resp is None:  # an older saga service: journal it the two-call way
            return await self._step(step_id, lambda _: result, step_type=kind, params=args)
        return result if resp.recorded else from_struct(resp.step.result)  # the first recorded result stands

    async def _record(self, request: saga_pb2.RecordStepRequest) -> saga_pb2.RecordStepResponse | None:
        """RecordStep; None when the service does not know it (it then never gets asked again)."""
        try:
            resp = await self.client.call(self.client.saga.RecordStep, request)
        except AwooopError as err:
            if err.code != grpc.StatusCode.UNIMPLEMENTED:
                raise
            self.client.record_steps = False
            return None
        if self._journal is not None:
            self._journal[request.step_id] = resp.step
        return resp

    # --- patches: new code for runs in flight ---

    async def patched(self, change_id: str) -> bool:
        """Whether this run takes the path of the code change `change_id`: True for a run that
        reaches this call on code that has it (its first attempt, or a replay past everything
        journaled), False for a run whose earlier attempt went past this point under the code
        before the change. The answer is journaled (step `patch:<change_id>`), so every later
        attempt gets the same one. Write `if await ctx.patched("x"): new() else: old()`; once
        `awooop builds patches` shows no unfinished run on the old path, delete it and the call
        (docs/versioning.md, "Patches")."""
        self._live("patched")
        if not 1 <= len(change_id) <= 120 or not change_id.isprintable() or " " in change_id:
            raise ValueError("change_id: 1-120 printable characters without spaces")
        if change_id in self._patches:
            return self._patches[change_id]
        step_id = PATCH_PREFIX + change_id
        first = self._journal is not None and self._replay is None  # a first attempt: nothing to replay
        known = None if first or self._journal_too_large else await self._known(step_id)
        if known is not None and known.status == common_pb2.STEP_STATUS_COMPLETED:
            answer = bool(from_struct(known.result).get("patched"))
        else:
            if self._replay is not None:
                answer = self._replay.at_frontier()
            else:  # a first attempt; or a journal too large to read: a marker, if any, answers below
                answer = first
            resp = await self._record(
                saga_pb2.RecordStepRequest(
                    lease=self.lease,
                    step_id=step_id,
                    step_type=common_pb2.STEP_TYPE_CALLBACK,
                    result=to_struct({"patched": answer}),
                )
            )
            if resp is not None and not resp.recorded:  # an earlier attempt's marker stands
                answer = bool(from_struct(resp.step.result).get("patched"))
        self._patches[change_id] = answer
        self.actions[step_id] = "patched" if answer else "unpatched"
        return answer

    # --- progress events ---

    async def emit(self, data: Mapping[str, Any] | None = None, *, kind: str = "", key: str | None = None) -> int:
        """Appends a progress event to the run's log, for whoever watches the run (WatchRun, the
        SSE stream, `awooop runs watch`); returns its offset. Fenced by the lease: a worker that
        lost its lease gets LeaseLost and nothing is written. Without `key` an emit is
        at-least-once: a handler that runs again after a crash emits again, and each event carries
        its attempt. With `key` (unique per run, e.g. "chunk-3") a repeat adds nothing and returns
        the first event's offset. Past the run's bounds AwooopError RUN_EVENTS_EXHAUSTED."""
        self._live("emit")
        await self.tokens.checkpoint()  # the tokens before the event come before it in the log
        resp = await self.client.call(
            self.client.scheduler.EmitEvent,
            scheduler_pb2.EmitEventRequest(
                lease=self.lease, kind=kind, data=to_struct(dict(data or {})), key=key or ""
            ),
        )
        return int(resp.offset)

    # --- token streams (tokens.py) ---

    async def stream_token(self, text: str, *, stream: str = DEFAULT_STREAM) -> None:
        """Publishes one token of partial output (an LLM's token) to the run's watchers: live
        within a few ms (batched), durable with the next checkpoint (every so many tokens or ms,
        before each ctx.emit, and before the run ends). Tokens are numbered per attempt and
        stream from 1; a run retried streams again from 1 under its new attempt. Fenced by the
        lease (LeaseLost). Awaits only when a batch is due."""
        self._live("stream_token")
        await self.tokens.token(text, stream)

    async def flush_tokens(self) -> None:
        """Sends every stream's pending tokens and writes them as a durable checkpoint now."""
        self._live("flush_tokens")
        await self.tokens.checkpoint()

    async def pipe_tokens(self, chunks: AsyncIterable[str], *, stream: str = DEFAULT_STREAM) -> str:
        """Streams each chunk of an async iterator (an LLM client's stream) as a token, checkpoints
        at its end and returns the whole text."""
        self._live("pipe_tokens")
        return await self.tokens.pipe(chunks, stream)

    # --- approvals ---

    async def request_approval(self, summary: str, *, step_id: str = "approval", ttl: float | None = None) -> Approval:
        """Journaled approval. Returns granted=True when this approval was already given (the run
        was approved and claimed again); otherwise asks for it: the lease is released, the run
        waits in WAITING_APPROVAL, and the returned token must reach the approver. Reject or expiry
        fails the run and compensates it; approval resumes it and the handler runs again from the
        top, skipping completed steps, and this call then returns granted=True."""
        with tracing.span(self.tracer, "awooop.worker.approval", attributes={"awooop.step_id": step_id}) as span:
            approval = await self._request_approval(summary, step_id=step_id, ttl=ttl)
            if span is not None:
                span.set_attribute("awooop.approved", approval.granted)
            return approval

    async def _request_approval(self, summary: str, *, step_id: str = "approval", ttl: float | None = None) -> Approval:
        """request_approval without its span."""
        self._live("request_approval")
        await self._reach(step_id, common_pb2.STEP_TYPE_APPROVAL_REQUEST)
        begin = await self.client.call(
            self.client.saga.BeginStep,
            saga_pb2.BeginStepRequest(
                lease=self.lease, step_id=step_id, step_type=common_pb2.STEP_TYPE_APPROVAL_REQUEST
            ),
        )
        action = ACTIONS.get(begin.action, "execute")
        self.actions[step_id] = action
        metrics.STEPS.labels(action).inc()
        if action == "skip":
            return Approval(granted=True, decided_by=str(from_struct(begin.step.result).get("decided_by", "")))
        if action == "retry" and await self._approved_since(begin.step.started_at.ToDatetime(dt.UTC)):
            decided_by = self.run.approval_decided_by
            await self.client.call(
                self.client.saga.CompleteStep,
                saga_pb2.CompleteStepRequest(
                    lease=self.lease, step_id=step_id, result=to_struct({"approved": True, "decided_by": decided_by})
                ),
            )
            return Approval(granted=True, decided_by=decided_by)
        async with self._ending("waiting_approval"):
            resp = await self.client.call(
                self.client.scheduler.RequestApproval,
                scheduler_pb2.RequestApprovalRequest(lease=self.lease, summary=summary, ttl=_duration(ttl)),
            )
        return Approval(granted=False, token=resp.approval_token, expires_at=resp.expires_at.ToDatetime(dt.UTC))

    async def _approved_since(self, started_at: dt.datetime) -> bool:
        """Was the run approved after this approval step was first journaled? (A pending approval
        step is also what a crash between BeginStep and RequestApproval leaves behind.)"""
        if not self.run.approval_decided_by:
            return False
        history = await self.client.call(
            self.client.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=self.run_id)
        )
        return any(
            e.from_status == common_pb2.RUN_STATUS_WAITING_APPROVAL
            and e.to_status == common_pb2.RUN_STATUS_RESUMED
            and e.at.ToDatetime(dt.UTC) >= started_at
            for e in history.events
        )

    # --- waiting on a slow tool ---

    @contextlib.asynccontextmanager
    async def wait_tool(self, tool_id: str) -> AsyncIterator[None]:
        """`async with ctx.wait_tool("tool"):` marks the run WAITING_TOOL for the block (the lease is
        still renewed by the heartbeat) and RUNNING again after it."""
        self._live("wait_tool")
        await self.client.call(
            self.client.scheduler.WaitTool, scheduler_pb2.WaitToolRequest(lease=self.lease, tool_id=tool_id)
        )
        try:
            yield
        except LeaseLost:
            raise
        except BaseException:
            if self.outcome is None:
                with contextlib.suppress(AwooopError):
                    await self.client.call(
                        self.client.scheduler.ResumeTool, scheduler_pb2.ResumeToolRequest(lease=self.lease)
                    )
            raise
        if self.outcome is None:
            await self.client.call(self.client.scheduler.ResumeTool, scheduler_pb2.ResumeToolRequest(lease=self.lease))

    # --- durable waits (waits.py) ---

    def _wait_step_id(self, kind: str, step_id: str | None) -> str:
        if step_id:
            return step_id
        n = self._wait_numbers[kind] = self._wait_numbers.get(kind, 0) + 1
        return f"{kind}-{n}"

    async def create_wait(self, timeout: float, *, step_id: str | None = None) -> WaitToken:
        """A wait token any system completes: `token.callback_url` (POST a JSON object) or the
        CompleteWait RPC with `token.wait_id`. It times out after `timeout` seconds. On a later
        attempt the same call (same step_id, or the same place in call order) finds the same wait."""
        self._live("create_wait")
        return await waits.create(self, timeout, self._wait_step_id("wait", step_id), scheduler_pb2.WAIT_KIND_TOKEN)

    async def wait(self, token: WaitToken) -> Json:
        """The completion's result. While the wait is open the run parks (no lease, no worker
        slot) and the handler unwinds; it runs again from the top once the wait ends, and this
        call then returns at once. Raises WaitTimeout when the wait timed out instead."""
        self._live("wait")
        completed, result = await waits.outcome(self, token)
        if not completed:
            raise WaitTimeout(token)
        return result

    async def wait_for_event(
        self,
        match: event_matches.Match,
        *,
        timeout: float,
        lookback: float = 300.0,
        step_id: str | None = None,
    ) -> Json:
        """The first channel event that `match` names (event_matches.py: an API event's
        correlation key, a string or {"channel": "api", "correlation_key": K}; a Telegram
        message in the same chat, {"channel": "telegram", "chat_id": C}; an Alertmanager resolve
        of the same group, {"channel": "alertmanager", "group_key": G}) that arrived at most
        `lookback` seconds before this wait was first created, or later: {"run_id",
        "provider_event_id", "payload", "arrived_at"}. The run parks until it arrives (matched
        by the scheduler's wait sweep); WaitTimeout when none did in `timeout` seconds."""
        self._live("wait_for_event")
        channel, key = event_matches.key_of(match)
        token = await waits.create(
            self,
            timeout,
            self._wait_step_id("event", step_id),
            scheduler_pb2.WAIT_KIND_EVENT,
            correlation_key=key,
            channel=common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{channel.upper()}"),
            lookback=lookback,
        )
        return await self.wait(token)

    async def sleep(self, seconds: float, *, step_id: str | None = None) -> None:
        """A durable sleep: the run parks until `seconds` have passed since the first attempt
        that reached this call, then goes on (a sleep always ends by its time)."""
        self._live("sleep")
        token = await waits.create(self, seconds, self._wait_step_id("sleep", step_id), scheduler_pb2.WAIT_KIND_SLEEP)
        await waits.outcome(self, token)

    # --- parked tool calls ---

    async def call_tool_parked(
        self,
        tool_id: str,
        params: Mapping[str, Any] | None = None,
        *,
        timeout: float,
        step_id: str | None = None,
        compensation: Compensation = None,
    ) -> Json:
        """A tool that completes later, without holding this worker: a journaled tool_call step
        that creates a wait (`<step_id>:wait`), starts the tool through the gateway with the
        wait's callback URL (ExecuteTool callback_url, under the step's idempotency key) and
        parks the run (WAITING_TOOL, no lease). The tool posts its outcome to the URL; the run
        resumes, the handler runs again from the top, and this call returns the posted result
        and completes the step (with its compensation, as `step` does). On any later attempt the
        completed step skips: the tool is not called again. Raises WaitTimeout when nothing was
        posted within `timeout` seconds and ParkedToolFailed when the tool posted an error. Step
        ids default to `tool-1`, `tool-2`, ... in call order."""
        self._live("call_tool_parked")
        sid = self._wait_step_id("tool", step_id)

        async def start_and_park(call: StepCall) -> Json:
            token = await waits.create(self, timeout, f"{sid}:wait", scheduler_pb2.WAIT_KIND_TOKEN)
            if token.callback_url:  # the wait is open and this attempt holds its token: (re)start the tool
                await waits.start_tool(self, call, token)
            return waits.tool_result(sid, await self.wait(token))

        return await self.step(sid, start_and_park, tool_id=tool_id, params=params, compensation=compensation)

    # --- child runs (children.py) ---

    async def start_child(
        self,
        input: Mapping[str, Any] | None = None,
        *,
        step_id: str | None = None,
        priority: int = 0,
        delay: float | None = None,
        concurrency_keys: Sequence[str] = (),
        max_attempts: int = 0,
    ) -> children.ChildHandle:
        """Starts a child run of this run's project (or finds the one an earlier attempt started
        under the same step id: `child-N` in call order when not given) and returns its handle;
        `await handle.result()` parks this run until the child has ended."""
        self._live("start_child")
        spec = children.Child(dict(input or {}), step_id, priority, delay, tuple(concurrency_keys), max_attempts)
        sid = self._wait_step_id("child", step_id)
        # the child's trace hangs under this span (StartChildRuns stores the call's context with it)
        with tracing.span(self.tracer, "awooop.worker.start_child", attributes={"awooop.step_id": sid}):
            return await children.start(self, spec, sid)

    async def run_children(
        self,
        specs: Sequence[children.Child | Mapping[str, Any]],
        *,
        fail_fast: bool = False,
        step_id: str | None = None,
        timeout: float | None = None,
    ) -> list[children.ChildOutcome]:
        """Starts the children (each a Child, or a plain input dict) in one call and parks this run
        until all have ended: then returns each child's outcome, in order. fail_fast: the wait ends
        at the first child that does not complete, and its unfinished siblings are cancelled.
        ChildrenTimeout when they did not all end in `timeout` seconds (default: no limit but the
        longest wait, 366 days)."""
        self._live("run_children")
        wait_step_id = self._wait_step_id("children", step_id)
        named: list[tuple[children.Child, str]] = []
        for spec in specs:
            child = spec if isinstance(spec, children.Child) else children.Child(dict(spec))
            named.append((child, self._wait_step_id("child", child.step_id)))
        attributes = {"awooop.step_id": wait_step_id, "awooop.children": len(named)}
        with tracing.span(self.tracer, "awooop.worker.run_children", attributes=attributes):
            return await children.run(self, named, wait_step_id, fail_fast, timeout)

    # --- the run's end ---

    @contextlib.asynccontextmanager
    async def _ending(self, outcome: str) -> AsyncIterator[None]:
        """Marks the run as leaving our hands while the ending call is in flight (the worker then
        neither renews nor cancels it). If the call is refused, the run is still ours: unmark it
        so the worker can fail it, release it or honour a cancel as usual."""
        self.outcome = outcome
        try:
            yield
        except LeaseLost:
            raise
        except BaseException:
            self.outcome = None
            raise

    async def complete(self, output: Mapping[str, Any] | None = None) -> common_pb2.Run:
        """RUNNING -> COMPLETED with output. (Returning a dict from the handler does the same.)"""
        self._live("complete")
        self.check_replayed()
        await self.tokens.checkpoint()  # the run's log holds its whole streamed output
        await self.tokens.close()
        request = scheduler_pb2.CompleteRunRequest(lease=self.lease, output=to_struct(dict(output or {})))
        async with self._ending("completed"):
            if self.completions is not None:
                return await self.completions.complete(request)
            resp = await self.client.call(self.client.scheduler.CompleteRun, request)
        return resp.run

    async def fail(
        self, reason: str, *, retryable: bool = False, error_code: str = "", retry_after: float | None = None
    ) -> common_pb2.Run:
        """Fails this attempt: retryable with attempts left -> PENDING again after a backoff;
        otherwise FAILED, and the saga compensates completed steps."""
        self._live("fail")
        with contextlib.suppress(AwooopError):  # what was streamed stays readable; the failure matters more
            await self.tokens.checkpoint()
        await self.tokens.close()
        async with self._ending("failed"):
            resp = await self.client.call(
                self.client.scheduler.FailRun,
                scheduler_pb2.FailRunRequest(
                    lease=self.lease,
                    reason=reason[:4096],
                    error_code=error_code[:64],
                    retryable=retryable,
                    retry_after=_duration(retry_after),
                ),
            )
        return resp.run

    async def hold(self, reason: str, *, error_code: str = NONDETERMINISM_CODE) -> common_pb2.Run:
        """Holds the run (HoldRun): PENDING, claimed by nobody, the attempt not counted, until an
        operator's UnholdRun (after deploying code that replays its journal) or CancelRun (which
        compensates it). The worker does this when the handler's code does not replay the journal."""
        if self.outcome is not None:
            raise RunFinished(f"hold: run {self.run_id} already {self.outcome}")
        async with self._ending("held"):
            resp = await self.client.call(
                self.client.scheduler.HoldRun,
                scheduler_pb2.HoldRunRequest(lease=self.lease, reason=reason[:4096], error_code=error_code[:64]),
            )
        return resp.run


def _step_kind(step_id: str, step_type: str | None, tool_id: str | None) -> str:
    """A step's kind (STEP_TYPES' key): step_type, else tool_call with a tool, else callback."""
    if step_id.startswith(PATCH_PREFIX):
        raise ValueError(f"step ids starting with {PATCH_PREFIX!r} are ctx.patched's")
    kind = step_type or ("tool_call" if tool_id else "callback")
    if kind not in STEP_TYPES:
        raise ValueError(f"step_type must be one of {', '.join(STEP_TYPES)}")
    return kind


def _as_result(value: Any, step_id: str) -> Json:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"step {step_id} must return a dict (or None), not {type(value).__name__}")


Handler = Callable[[RunContext], Awaitable[Mapping[str, Any] | None]]
