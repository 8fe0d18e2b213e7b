"""Worker: claims runs, keeps their leases alive, runs a handler per run, and stops cleanly.

- Claiming: one ClaimRuns long-poll at a time, asking for as many runs as there are free slots
  (`concurrency`). The scheduler wakes it as soon as a run becomes claimable.
- Leases: one background task sends ONE Heartbeat for every held lease each `heartbeat_interval`.
  A lease reported LEASE_LOST (reaped, stolen, finished) cancels its handler task at once; a
  reported cancel request cancels the handler and then acknowledges the cancel (-> CANCELLED).
  If heartbeats keep failing until the lease must have expired, the handler is stopped too:
  another worker may already own the run.
- Ending a run: returning from the handler completes the run with the returned dict as output
  (unless the handler completed, failed or handed it to an approver itself). Completions go
  through one batcher (completions.py): those ready while a CompleteRuns call is in flight
  share the next call, each still getting its own result or error. When every slot is busy,
  the runs that finish ride on the next ClaimRuns instead (ClaimRunsRequest.complete: one call
  completes them and claims their successors), so a busy worker's cycle is ClaimRuns and
  Heartbeat. An uncaught
  exception fails the attempt as retryable (the scheduler retries while attempts are left).
- Shutdown (SIGTERM, SIGINT or stop()): stop claiming, give running handlers `shutdown_grace`
  seconds (from the stop) to finish, then cancel the rest and hand their leases back with
  ReleaseRun, so the runs are claimable again immediately instead of after a lease timeout.
  Every run held then is settled before run() returns: completed, failed, handed back (or no
  longer ours: LEASE_LOST). Settling calls that end UNAVAILABLE / DEADLINE_EXCEEDED are sent
  again (settling.py) until `call_timeout` after the grace (ending calls; a run that still cannot
  be ended is handed back instead) or twice that (hand-backs). A ClaimRuns in flight at the stop
  is not cancelled: the scheduler may have claimed runs for it already and a cancelled call
  would drop its answer, leaving them RUNNING until their lease expires. Its answer is awaited
  (it ends by its own wait) and the runs it brings, like any claimed while stopping, are handed
  back unstarted. Runs that could not be settled are logged and run() raises WorkerError
  (a non-zero exit).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import secrets
import signal
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import grpc

from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import metrics, settling, tracing
from awooop.worker.claim_ids import ClaimIds
from awooop.worker.client import DEFAULT_TIMEOUT, Client
from awooop.worker.completions import CompletionBatcher
from awooop.worker.context import Handler, RunContext, _duration
from awooop.worker.errors import AwooopError, LeaseLost, RunFinished
from awooop.worker.replay import Nondeterminism
from awooop.worker.waits import TIMED_OUT_CODE, RunParked, WaitTimeout

log = logging.getLogger("awooop.worker")

# why the worker stopped a handler
LOST = "lease_lost"
CANCEL = "cancel_requested"
SHUTDOWN = "shutdown"

# errors that no retry will fix: the worker stops instead of spinning
FATAL_CODES = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED, grpc.StatusCode.INVALID_ARGUMENT)
HEARTBEAT_BATCH = 1000  # the scheduler's limit per Heartbeat call


class WorkerError(Exception):
    """The worker cannot go on (bad key, no worker role, invalid configuration)."""


def default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(2)}"[-128:]


@dataclass
class _Held:
    ctx: RunContext
    ttl: float  # lease length in seconds, as granted
    renewed_until: float  # monotonic time by which the lease surely ends without a renewal
    task: asyncio.Task[None] | None = None
    stop_reason: str | None = None
    # the handler returned or raised: the run is being ended (completed, failed), never cancelled
    handler_done: bool = False
    settled: bool = False  # ended, handed back or no longer ours: nothing is left to tell the scheduler

    @property
    def key(self) -> tuple[str, int]:
        return (self.ctx.run_id, self.ctx.attempt)


# the environment variable a Worker without build_id= takes its build from (docs/versioning.md)
BUILD_ENV = "AWOOOP_WORKER_BUILD"
# the environment variable a Worker without labels= takes its labels from, as key=value,key=value
# (docs/flow-control.md, "Worker labels")
LABELS_ENV = "AWOOOP_WORKER_LABELS"


def labels_from_env(value: str) -> dict[str, str]:
    """AWOOOP_WORKER_LABELS's key=value,key=value as labels ("" none)."""
    out: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key, eq, label = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"{LABELS_ENV}: {item!r} is not key=value")
        out[key.strip()] = label.strip()
    return out


@dataclass
class WorkerStats:
    claimed: int = 0
    completed: int = 0
    failed: int = 0
    waiting_approval: int = 0
    lost: int = 0
    cancelled: int = 0
    released: int = 0
    held: int = 0  # held for an operator: the code does not replay the run's journal (HoldRun)
    heartbeats_sent: int = 0  # Heartbeat calls
    leases_renewed: int = 0  # leases those calls renewed (one call renews every held lease)
    claims_sent: int = 0  # ClaimRuns calls
    claim_errors: int = 0  # ClaimRuns calls that failed after the channel's own retries
    early_empty_claims: int = 0  # long-polls answered empty well before their wait (then backed off)
    by_outcome: dict[str, int] = field(default_factory=dict)


class Worker:
    """Runs `handler(ctx)` for each run claimed from `projects`.

    async def handle(ctx: RunContext) -> dict: ...
    await Worker(handle, projects=["demo"]).run()   # until SIGTERM / SIGINT / stop()
    """

    def __init__(
        self,
        handler: Handler,
        *,
        projects: Iterable[str],
        key: str | None = None,
        scheduler: str | None = None,
        saga: str | None = None,
        gateway: str | None = None,  # the tool gateway of ctx.call_tool_parked (AWOOOP_GATEWAY_ADDR)
        worker_id: str | None = None,
        concurrency: int = 4,
        lease_ttl: float | None = None,
        heartbeat_interval: float | None = None,
        claim_wait: float = 20.0,
        call_timeout: float = DEFAULT_TIMEOUT,
        shutdown_grace: float = 20.0,
        tls: bool | None = None,
        ca_file: str | None = None,
        client: Client | None = None,
        channel_options: Sequence[tuple[str, Any]] | None = None,
        tracer_provider: Any = None,
        build_id: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> None:
        """The options are documented in docs/worker-sdk.md. Long because it is a flat list of
        them: each is checked and kept here once, beside the state the worker's loops share."""
        metrics.register()  # a process with a Worker exports the awooop_worker_* metrics
        self.handler = handler
        self.projects = list(projects)
        if not self.projects:
            raise ValueError("projects: give at least one project to claim runs from")
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.worker_id = worker_id or default_worker_id()
        # the build of this worker's code (docs/versioning.md); "" declares none
        self.build_id = os.environ.get(BUILD_ENV, "") if build_id is None else build_id
        # what this worker offers runs that require or prefer labels (docs/flow-control.md)
        self.labels = labels_from_env(os.environ.get(LABELS_ENV, "")) if labels is None else dict(labels)
        self.concurrency = concurrency
        # None: the scheduler's configured lease (default 5 min)
        self.lease_ttl = lease_ttl
        self.heartbeat_interval = heartbeat_interval or min(30.0, (lease_ttl or 300.0) / 3)
        if lease_ttl and self.heartbeat_interval >= lease_ttl:
            raise ValueError("heartbeat_interval must be shorter than lease_ttl")
        self.claim_wait = claim_wait
        self.call_timeout = call_timeout
        self.shutdown_grace = shutdown_grace
        self._own_client = client is None
        self.client = client or Client(
            key=key,
            scheduler=scheduler,
            saga=saga,
            gateway=gateway,
            timeout=call_timeout,
            tls=tls,
            ca_file=ca_file,
            channel_options=channel_options,
            tracer_provider=tracer_provider,
        )
        # OpenTelemetry (None: off): each run a span of its trace, each step a child span
        provider = tracing.resolve(tracer_provider) or self.client.tracer_provider
        self.tracer = provider.get_tracer(tracing.SCOPE) if provider is not None else None
        self.completions = CompletionBatcher(self.client)
        self.stats = WorkerStats()
        self._held: dict[tuple[str, int], _Held] = {}
        self._stopping = asyncio.Event()
        self._slot_freed = asyncio.Event()
        self._awaiting_slot = False  # the claim loop waits for a slot: completions ride on its claim
        self.completions.set_carrier(lambda: self._awaiting_slot and not self._stopping.is_set(), self._slot_freed.set)
        self._running = False
        self._claim_ids = ClaimIds()  # a claim whose answer was lost is retried with its id
        self._stopped_at: float | None = None  # monotonic time of the stop: the grace counts from it
        self._claim: asyncio.Future[Any] | None = None  # a ClaimRuns in flight at the stop: its runs go back
        self._returning: list[asyncio.Task[None]] = []  # hand-backs of runs claimed while stopping
        self._unsettled: list[tuple[str, int]] = []  # leases that could be neither ended nor handed back

    # --- public ---

    @property
    def held(self) -> list[tuple[str, int]]:
        """(run_id, attempt) of every lease held now."""
        return list(self._held)

    @property
    def heartbeats_sent(self) -> int:
        return self.stats.heartbeats_sent

    def stop(self) -> None:
        """Asks the worker to stop: no new claims; running handlers finish or are released."""
        if self._stopping.is_set():
            return
        self._stopped_at = time.monotonic()
        self._stopping.set()
        log.info(
            "worker stopping: no new claims; handlers finish or are handed back",
            extra={"worker_id": self.worker_id, "held": len(self._held), "grace_s": self.shutdown_grace},
        )

    async def run(self, *, install_signal_handlers: bool = True) -> None:
        """Claims and handles runs until stop(), SIGTERM or SIGINT; then shuts down cleanly."""
        if self._running:
            raise RuntimeError("worker already running")
        self._running = True
        loop = asyncio.get_running_loop()
        signals: list[signal.Signals] = []
        if install_signal_handlers:
            for sig in (signal.SIGTERM, signal.SIGINT):
                with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                    loop.add_signal_handler(sig, self.stop)
                    signals.append(sig)
        heartbeats = asyncio.create_task(self._heartbeat_loop(), name="awooop-heartbeat")
        log.info(
            "worker started",
            extra={"worker_id": self.worker_id, "projects": self.projects, "concurrency": self.concurrency},
        )
        try:
            await self._claim_loop()
        finally:
            self.stop()  # also after a fatal error: handlers see ctx.stopping, the grace counts from now
            self.completions.release_held()
            await self._shutdown()
            unsettled = self._log_unsettled()  # logged even when a fatal error ends the worker
            heartbeats.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeats
            for sig in signals:
                loop.remove_signal_handler(sig)
            if self._own_client:
                await self.client.close()
            self._running = False
            log.info("worker stopped", extra={"worker_id": self.worker_id})
        if unsettled:
            raise WorkerError(unsettled)

    # --- claiming ---

    async def _claim_loop(self) -> None:
        backoff = 0.2
        early = 0  # long-polls in a row answered empty well before their wait
        while not self._stopping.is_set():
            # runs whose completion waits for this claim are done: their slots are free
            free = self.concurrency - len(self._held) + self.completions.held
            if free <= 0:
                self._slot_freed.clear()
                self._awaiting_slot = True
                try:
                    await self._until_stopping(self._slot_freed.wait())
                finally:
                    self._awaiting_slot = False
                continue
            carried = self.completions.take()
            if carried:
                await self._claim_carrying(carried, free)
                continue
            claim_id, max_runs = self._claim_ids.next(min(free, 100))
            request = scheduler_pb2.ClaimRunsRequest(
                worker_id=self.worker_id,
                project_ids=self.projects,
                max_runs=max_runs,
                wait=_duration(self.claim_wait),
                lease_ttl=_duration(self.lease_ttl),
                claim_id=claim_id,
                build_id=self.build_id,
                labels=self.labels,
            )
            sent_at = time.monotonic()
            self.stats.claims_sent += 1
            claim = asyncio.ensure_future(
                self.client.call(self.client.scheduler.ClaimRuns, request, timeout=self.claim_wait + self.call_timeout)
            )
            if not await self._until_stopping(claim, cancel=False):
                self._claim = claim  # stopping: its answer is handed back (see the module's docstring)
                break
            try:
                response = claim.result()
            except AwooopError as err:
                self._claim_ids.answered(err)
                if err.code in FATAL_CODES:
                    raise WorkerError(f"ClaimRuns: {err}") from None
                self.stats.claim_errors += 1
                log.warning("claim failed; retrying", extra={"error": str(err), "backoff_s": backoff})
                await self._until_stopping(asyncio.sleep(backoff))
                backoff = min(backoff * 2, 5.0)
                continue
            self._claim_ids.answered()
            backoff = 0.2
            self._accept(response.runs)
            if response.runs or self.claim_wait <= 0 or time.monotonic() - sent_at >= self.claim_wait / 2:
                early = 0
                continue
            # empty long before the wait was over: a scheduler ending its long-polls (an older
            # one draining) or one that cannot wait; back off so this is no claim storm
            early += 1
            self.stats.early_empty_claims += 1
            pause = min(0.05 * 2**early, 2.0, self.claim_wait) * random.uniform(0.5, 1.0)
            await self._until_stopping(asyncio.sleep(pause))

    async def _claim_carrying(self, carried: list[Any], free: int) -> None:
        """One ClaimRuns that also completes the carried runs. It does not wait for work (a
        scheduler without the field would: wait 0), so it is awaited to the end, stop or not:
        the completions' callers get their answers."""
        claim_id, max_runs = self._claim_ids.next(min(free, 100))
        request = scheduler_pb2.ClaimRunsRequest(
            worker_id=self.worker_id,
            project_ids=self.projects,
            max_runs=max_runs,
            lease_ttl=_duration(self.lease_ttl),
            complete=[r for r, _ in carried],
            claim_id=claim_id,
            build_id=self.build_id,
            labels=self.labels,
        )
        self.stats.claims_sent += 1
        try:
            response = await self.client.call(self.client.scheduler.ClaimRuns, request)
        except AwooopError as err:
            self._claim_ids.answered(err)
            self.stats.claim_errors += 1
            # bad input: the completions go again with CompleteRuns and the next claim, without
            # them, tells whether the claim itself was bad (then fatal, as always)
            self.completions.claim_failed(carried, err)
            if err.code != grpc.StatusCode.INVALID_ARGUMENT:
                if err.code in FATAL_CODES:
                    raise WorkerError(f"ClaimRuns: {err}") from None
                log.warning("claim failed; retrying", extra={"error": str(err)})
                await self._until_stopping(asyncio.sleep(0.2))
            return
        self._claim_ids.answered()
        self.completions.settle(carried, response.completed)
        self._accept(response.runs)

    async def _until_stopping(self, aw: Any, *, cancel: bool = True) -> bool:
        """Awaits aw unless stop() comes first (then cancels it, unless cancel=False: it goes on).
        True when aw finished."""
        task = asyncio.ensure_future(aw)
        stop = asyncio.ensure_future(self._stopping.wait())
        try:
            await asyncio.wait({task, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
        if task.done():
            return True
        if not cancel:
            return False
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, AwooopError):
            await task
        return False

    def _accept(self, runs: Iterable[scheduler_pb2.ClaimedRun]) -> None:
        """Starts a handler for each claimed run; once stopping, hands them back unstarted."""
        for claimed in runs:
            if self._stopping.is_set():
                task = asyncio.create_task(self._return_claimed(claimed), name=f"awooop-return-{claimed.lease.run_id}")
                self._returning.append(task)
            else:
                self._start(claimed)

    async def _return_claimed(self, claimed: scheduler_pb2.ClaimedRun) -> None:
        self.stats.claimed += 1
        ctx = RunContext(self.client, claimed, self.worker_id, self._stopping, self.completions, tracer=self.tracer)
        ctx.log.info("claimed while stopping; handing it back unstarted", extra={"worker_id": self.worker_id})
        if not await self._hand_back(ctx):
            self._unsettled.append((ctx.run_id, ctx.attempt))

    def _start(self, claimed: scheduler_pb2.ClaimedRun) -> None:
        ctx = RunContext(self.client, claimed, self.worker_id, self._stopping, self.completions, tracer=self.tracer)
        ttl = self.lease_ttl or _granted_ttl(claimed) or 300.0
        h = _Held(ctx=ctx, ttl=ttl, renewed_until=time.monotonic() + ttl)
        self._held[h.key] = h
        metrics.HELD.set(len(self._held))
        self.stats.claimed += 1
        ctx.log.info("claimed run", extra={"resumed": ctx.resumed, "worker_id": self.worker_id})
        h.task = asyncio.create_task(self._execute(h), name=f"awooop-run-{ctx.run_id}")

    # --- one run ---

    async def _execute(self, h: _Held) -> None:
        ctx = h.ctx
        attributes = {"awooop.run_id": ctx.run_id, "awooop.attempt": ctx.attempt, "awooop.worker_id": self.worker_id}
        with tracing.span(
            self.tracer,
            "awooop.worker.run",
            traceparent=ctx.traceparent,
            attributes=attributes,
            kind="CONSUMER",
            claimed_since_ns=ctx.claimable_since_ns,
        ) as span:
            if span is not None:  # the run's log lines name its trace
                trace_id = format(span.get_span_context().trace_id, "032x")
                ctx.log.extra = {**(ctx.log.extra or {}), "trace_id": trace_id}
            await self._execute_traced(h)

    async def _execute_traced(self, h: _Held) -> None:
        try:
            h.settled = await self._handle(h)
        finally:
            await h.ctx.tokens.close()  # a parked, lost or released run's batch timers stop with it
            self._held.pop(h.key, None)
            metrics.HELD.set(len(self._held))
            self._slot_freed.set()
            if not h.settled and self._stopping.is_set():
                self._unsettled.append(h.key)

    async def _handle(self, h: _Held) -> bool:
        """Runs the handler and ends the run by its outcome. True when the run is settled."""
        ctx = h.ctx
        try:
            try:
                output = await self.handler(ctx)
            finally:
                h.handler_done = True
        except asyncio.CancelledError:
            if h.stop_reason is None:
                raise  # not ours: the event loop is going away
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            return await self._after_stop(h)
        except LeaseLost:
            self._count("lost")
            ctx.log.warning("lease lost; handler stopped")
            return True
        except RunFinished as exc:
            ctx.log.error("handler kept using a finished run: %s", exc)
            return True
        except RunParked:  # parked on a durable wait: no longer ours until the wait ends
            self._count("parked")
            return True
        except Exception as exc:
            if ctx.finished:
                ctx.log.exception("handler raised after the run was %s", ctx.outcome)
                return True
            if ctx.nondeterminism is not None:  # raised, or caught and followed by another error
                return await self._hold(h)
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, WaitTimeout):  # a wait's time ran out and the handler did not go on: fail it
                ctx.log.warning("handler left a wait timeout uncaught; failing the run")
                return await self._final(h, "failed", lambda: ctx.fail(reason, error_code=TIMED_OUT_CODE))
            ctx.log.exception("handler raised; failing the attempt (retryable)")
            return await self._final(
                h, "failed", lambda: ctx.fail(reason, retryable=True, error_code="E-WORKER-HANDLER")
            )
        if h.stop_reason is not None:  # the handler swallowed our cancellation
            return await self._after_stop(h)
        if ctx.finished:
            self._count(ctx.outcome or "completed")
            return True
        with contextlib.suppress(Nondeterminism):
            ctx.check_replayed()  # remembered in ctx.nondeterminism
        if ctx.nondeterminism is not None:
            return await self._hold(h)
        result = _as_output(output)
        return await self._final(h, "completed", lambda: ctx.complete(result))

    async def _hold(self, h: _Held) -> bool:
        """The handler's code does not replay the run's journal: hold the run for an operator
        (HoldRun) instead of failing it, which would compensate work the right code might finish."""
        ctx, found = h.ctx, h.ctx.nondeterminism
        ctx.log.error("holding the run for an operator: %s", found)
        return await self._final(h, "held", lambda: ctx.hold(str(found)))

    async def _final(self, h: _Held, outcome: str, end: Callable[[], Awaitable[Any]]) -> bool:
        """Ends the run with end() (sent again after UNAVAILABLE / DEADLINE_EXCEEDED while the
        lease lasts, or the shutdown allows). One that cannot be ended while stopping is handed
        back. True when settled."""
        ctx = h.ctx
        try:
            await settling.until(lambda: self._ending_deadline(h), lambda _timeout: end())
            self._count(outcome)
            return True
        except LeaseLost:
            self._count("lost")
            ctx.log.warning("lease lost before the run could be %s", outcome)
            return True
        except AwooopError as err:
            if not self._stopping.is_set():
                self._count("error")
                ctx.log.error("could not record the run as %s: %s", outcome, err)
                return False
            ctx.log.warning("could not record the run as %s (%s); handing it back", outcome, err)
            return await self._hand_back(ctx)

    async def _after_stop(self, h: _Held) -> bool:
        """Tells the scheduler why the handler was stopped. True when settled."""
        ctx, lease = h.ctx, h.ctx.lease
        if h.stop_reason == LOST:
            self._count("lost")
            metrics.LEASES_LOST.inc()
            ctx.log.warning("lease lost; handler cancelled")
            return True
        if h.stop_reason == SHUTDOWN:
            return await self._hand_back(ctx)
        try:
            await settling.until(
                self._settle_deadline,
                lambda timeout: self.client.call(
                    self.client.scheduler.AcknowledgeCancel,
                    scheduler_pb2.AcknowledgeCancelRequest(lease=lease),
                    timeout=min(timeout, self.call_timeout),
                ),
            )
        except AwooopError as err:
            self._count("lost" if isinstance(err, LeaseLost) else "error")
            ctx.log.warning("after stopping the handler (%s): %s", h.stop_reason, err)
            return isinstance(err, LeaseLost)
        self._count("cancelled")
        ctx.log.info("cancel requested; handler cancelled and cancel acknowledged")
        return True

    async def _hand_back(self, ctx: RunContext) -> bool:
        """ReleaseRun (the attempt is not counted), sent again after UNAVAILABLE /
        DEADLINE_EXCEEDED until the shutdown's settle deadline. True when settled."""
        request = scheduler_pb2.ReleaseRunRequest(lease=ctx.lease, reason=f"worker {self.worker_id} shutting down")
        try:
            await settling.until(
                self._settle_deadline,
                lambda timeout: self.client.call(
                    self.client.scheduler.ReleaseRun, request, timeout=min(timeout, self.call_timeout)
                ),
            )
        except LeaseLost as err:  # released by an earlier try whose answer was lost, or reaped meanwhile
            self._count("lost")
            ctx.log.warning("hand-back: lease no longer ours: %s", err)
            return True
        except AwooopError as err:
            self._count("error")
            ctx.log.error("could not hand the run back: %s", err)
            return False
        self._count("released")
        ctx.log.info("worker shutting down; lease handed back")
        return True

    # --- deadlines ---

    def _grace_end(self) -> float:
        return (self._stopped_at or time.monotonic()) + self.shutdown_grace

    def _settle_deadline(self) -> float:
        """Hand-backs are tried until then: two call timeouts after the grace."""
        return self._grace_end() + 2 * self.call_timeout

    def _ending_deadline(self, h: _Held) -> float:
        """Ending calls are tried again while the lease surely lasts; when stopping, until one call
        timeout after the grace (the other leaves time for a hand-back)."""
        if self._stopping.is_set():
            return self._grace_end() + self.call_timeout
        return h.renewed_until

    def _count(self, outcome: str) -> None:
        metrics.RUNS.labels(outcome).inc()
        self.stats.by_outcome[outcome] = self.stats.by_outcome.get(outcome, 0) + 1
        if outcome in ("completed", "failed", "waiting_approval", "lost", "cancelled", "released", "held"):
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)

    def _stop_handler(self, h: _Held, reason: str) -> None:
        if h.stop_reason is not None or h.ctx.finished or h.handler_done or h.task is None or h.task.done():
            return  # already stopping, or the run is being completed/failed/handed over (or retried) now
        h.stop_reason = reason
        h.task.cancel()

    # --- leases ---

    async def _heartbeat_loop(self) -> None:
        while True:
            await asyncio.sleep(self.heartbeat_interval)
            try:
                await self.heartbeat_once()
            except Exception:  # a bug here must not silently end lease renewal for every run
                log.exception("heartbeat round failed")

    async def heartbeat_once(self) -> None:
        """Renews every held lease with one Heartbeat call (per 1000 leases) and stops the
        handlers whose lease is lost or whose run was asked to cancel."""
        live = [h for h in self._held.values() if h.stop_reason is None and not h.ctx.finished]
        for i in range(0, len(live), HEARTBEAT_BATCH):
            batch = live[i : i + HEARTBEAT_BATCH]
            sent_at = time.monotonic()
            self.stats.claims_sent += 1
            self.stats.heartbeats_sent += 1
            request = scheduler_pb2.HeartbeatRequest(
                worker_id=self.worker_id,
                leases=[h.ctx.lease for h in batch],
                lease_ttl=_duration(self.lease_ttl),
            )
            try:
                response = await self.client.call(self.client.scheduler.Heartbeat, request)
            except AwooopError as err:
                metrics.HEARTBEATS.labels("error").inc()
                log.warning("heartbeat failed", extra={"error": str(err), "leases": len(batch)})
                for h in batch:
                    if time.monotonic() >= h.renewed_until:
                        h.ctx.log.warning("lease expired without a successful heartbeat; stopping the handler")
                        self._stop_handler(h, LOST)
                continue
            metrics.HEARTBEATS.labels("ok").inc()
            by_key = {h.key: h for h in batch}
            for renewal in response.renewals:
                held = by_key.get((renewal.lease.run_id, renewal.lease.attempt))
                if held is None:
                    continue
                if renewal.outcome == scheduler_pb2.LEASE_OUTCOME_LEASE_LOST:
                    self._stop_handler(held, LOST)
                elif renewal.cancel_requested:
                    self._stop_handler(held, CANCEL)
                elif renewal.outcome == scheduler_pb2.LEASE_OUTCOME_RENEWED:
                    held.renewed_until = sent_at + held.ttl
                    self.stats.leases_renewed += 1

    # --- shutdown ---

    async def _shutdown(self) -> None:
        """Gives handlers the rest of the grace, stops the others, and waits until every run held
        is settled (or its settling gave up); hands back what an in-flight claim brings meanwhile."""
        claim = asyncio.ensure_future(self._return_in_flight_claim())
        tasks = [h.task for h in self._held.values() if h.task is not None]
        if tasks:
            log.info("waiting for running handlers", extra={"handlers": len(tasks), "grace_s": self.shutdown_grace})
            await asyncio.wait(tasks, timeout=max(0.0, self._grace_end() - time.monotonic()))
        for h in list(self._held.values()):
            self._stop_handler(h, SHUTDOWN)
        rest = [h.task for h in self._held.values() if h.task is not None and not h.task.done()]
        if rest:
            # each settles by its deadline; the extra call timeout bounds a handler that ignores cancellation
            await asyncio.wait(rest, timeout=max(0.0, self._settle_deadline() + self.call_timeout - time.monotonic()))
        await claim
        if self._returning:
            await asyncio.wait(self._returning)

    async def _return_in_flight_claim(self) -> None:
        """Awaits the ClaimRuns in flight at the stop and hands back the runs it claimed."""
        if self._claim is None:
            return
        try:
            response = await self._claim
        except AwooopError:
            return  # no answer: a call that ended unanswered has its runs handed back by the scheduler
        self._accept(response.runs)

    def _log_unsettled(self) -> str:
        """Logs the runs held at the stop that are neither ended nor handed back; the error for
        run() to raise ("" when there are none)."""
        left = sorted({*self._unsettled, *self._held})
        if not left:
            return ""
        names = ", ".join(f"{run_id} (attempt {attempt})" for run_id, attempt in left)
        log.error(
            "could not settle %d runs before stopping; they stay RUNNING until their lease expires: %s",
            len(left),
            names,
            extra={"worker_id": self.worker_id, "runs": [run_id for run_id, _ in left]},
        )
        return f"could not settle {len(left)} runs before stopping: {names}"


def _granted_ttl(claimed: scheduler_pb2.ClaimedRun) -> float | None:
    """Lease length the scheduler granted, from two database timestamps (no clock skew)."""
    if claimed.HasField("lease_until") and claimed.run.HasField("heartbeat_at"):
        ttl = (claimed.lease_until.ToNanoseconds() - claimed.run.heartbeat_at.ToNanoseconds()) / 1e9
        return ttl if ttl > 0 else None
    return None


def _as_output(value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    return {"result": value}


def run_worker(handler: Handler, **config: Any) -> None:
    """Blocking convenience: asyncio.run(Worker(handler, **config).run())."""
    asyncio.run(Worker(handler, **config).run())
