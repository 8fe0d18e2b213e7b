"""The compensation driver (seed ADR-119 D4–D6): drives every recorded compensation request to
an end, in reverse step order, through the ToolGateway contract.

Durability: requests live in awooop_compensation_request. A replica claims open ones with
FOR UPDATE SKIP LOCKED (pending, or running with an expired lease), so any number of replicas
may run this loop and a crashed replica's work is taken over after settings.compensation_lease.
The request's lease is named as the run lease is (worker_id, attempt_count, lease_until;
migration 0140): (worker_id, attempt_count) is the fencing token every write re-checks, so a
replica that lost its lease writes nothing. The statements are in driver.sql.

Never twice: before calling the gateway a step is marked 'compensating' (durable intent). A
crash then leaves it 'compensating'; the next owner calls the gateway again with the SAME
idempotency key "<run_id>:<step_id>:compensate", and the gateway replays the first result
instead of running the command again.

A key the gateway refuses (UNAUTHENTICATED) is not a failed command: nothing ran. The request is
handed back (pending), the saga turns NOT_SERVING and claims nothing until the gateway accepts
the key again (gateway_auth.GatewayAuth), then carries on as after a crash.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Any, TypedDict
from uuid import UUID

import asyncpg
import grpc
from opentelemetry.trace import Status, StatusCode

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common import loops, tracing
from services.common.audit import audit
from services.common.db import Conn, store_error
from services.common.jsonvalues import struct_dict
from services.common.observability import RUN_ID
from services.common.peers import peer_channel
from services.common.runtime import AppContext
from services.common.sagastate import SAGA_TRANSITIONS, SagaAction, SagaAudit, SagaStatus, StepStatus
from services.common.validate import to_struct
from services.saga import driver_sql, saga_status
from services.saga.gateway_auth import HOW, GatewayAuth
from services.saga.metrics import (
    COMPENSATION_RUNS,
    COMPENSATIONS,
    GATEWAY_LATENCY,
    GATEWAY_UNAUTHENTICATED,
    SKIPPED,
    UndoOutcome,
)
from services.saga.notifier import LOOP as ALERTS_LOOP
from services.saga.notifier import Notifier

log = logging.getLogger("awooop.saga.driver")

ACTOR = "service:saga"
BATCH = 10  # requests claimed per pass (driven concurrently)
LOOP = "saga_compensation"
MAX_ROUNDS = 10  # re-reads of the eligible steps per claim (retries re-open steps meanwhile)
# gateway answers worth another try before a compensation counts as failed
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
GATEWAY_TRIES = 3
GATEWAY_BACKOFF = (0.2, 0.5)

# the saga statuses the driver starts, or skips, a compensation from
STARTS_FROM = SAGA_TRANSITIONS[SagaAction.START].allowed_from
SKIPS_FROM = SAGA_TRANSITIONS[SagaAction.SKIP].allowed_from


@dataclass(frozen=True)
class Claim:
    run_id: UUID
    project_id: str
    trigger: str
    reason: str | None
    attempt: int  # the request's attempt_count after this claim: with worker_id, the fencing token


@dataclass(frozen=True)
class Outcome:
    ok: bool
    replayed: bool = False
    error: str = ""
    result: dict[str, Any] | None = None
    refused: bool = False  # the gateway refused our key (UNAUTHENTICATED): nothing ran


class Lease(TypedDict):
    """The fencing token's parameters of the driver's statements (worker_id, attempt) and the run."""

    run_id: UUID
    worker_id: str
    attempt: int


class LeaseLost(Exception):
    """Another replica took the request over (our lease expired); stop touching it."""


class KeyRefused(Exception):
    """The gateway refused AWOOOP_INTERNAL_API_KEY; the request was handed back to wait for a key."""


def worker_id() -> str:
    """This replica's worker_id on the requests it holds."""
    return f"saga-{socket.gethostname()[:60]}-{os.getpid()}-{secrets.token_hex(3)}"


class CompensationDriver:
    def __init__(self, ctx: AppContext, notifier: Notifier) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.pool = ctx.pool
        self.notifier = notifier
        self.worker_id = worker_id()
        self._kick = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._stub: tools_pb2_grpc.ToolGatewayServiceAsyncStub | None = None
        # the saga presents its service key to the gateway (which scopes calls per project)
        key = self.settings.internal_api_key
        self._gateway_metadata = (("authorization", f"Bearer {key}"),) if key else ()
        # no key, or one the gateway refuses: NOT_SERVING, and no request is claimed meanwhile
        self.auth = GatewayAuth(self.settings, self._gateway, self._gateway_metadata)
        if self.settings.compensation_lease <= self.settings.tool_timeout:
            log.warning(
                "AWOOOP_COMPENSATION_LEASE should exceed AWOOOP_TOOL_TIMEOUT: a replica may take over a "
                "compensation while a tool call is still running (safe: the gateway replays, but wasteful)"
            )

    # ---------------------------------------------------------------- loop

    def kick(self) -> None:
        """Run a pass now (Compensate and RetryCompensation call this after they commit)."""
        self._kick.set()

    async def loop(self) -> None:
        """Background loop: a pass every compensation_interval, or at once when kicked; each
        pass also delivers pending escalation alerts (counted as their own loop)."""
        loops.register(LOOP)
        loops.register(ALERTS_LOOP)
        while not self.ctx.stopping.is_set():
            claimed = 0
            try:
                if await self.auth.usable():
                    claimed = await self.run_pass()
                loops.pass_done(LOOP)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                loops.pass_failed(LOOP, exc)
            try:
                await self.notifier.deliver_pending()
                loops.pass_done(ALERTS_LOOP)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                loops.pass_failed(ALERTS_LOOP, exc)
            if claimed >= BATCH:
                continue  # more may be waiting
            await self._idle()
            self._kick.clear()

    async def _idle(self) -> None:
        """Until the interval ends, a kick, or shutdown: waiting on the kick alone held SIGTERM
        up to a whole AWOOOP_COMPENSATION_INTERVAL (then the runtime's grace) before the loop ended."""
        waits = [asyncio.ensure_future(self._kick.wait()), asyncio.ensure_future(self.ctx.stopping.wait())]
        try:
            await asyncio.wait(waits, timeout=self.settings.compensation_interval, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()

    async def run_pass(self) -> int:
        rows = await driver_sql.claim_compensation_requests(
            self.pool, worker_id=self.worker_id, lease_ttl=float(self.settings.compensation_lease), batch=BATCH
        )
        claims = [Claim(r["run_id"], r["project_id"], r["trigger"], r["reason"], r["attempt_count"]) for r in rows]
        await asyncio.gather(*(self._drive_logged(c) for c in claims))
        return len(claims)

    async def _drive_logged(self, claim: Claim) -> None:
        token = RUN_ID.set(str(claim.run_id))  # log lines of this compensation carry its run_id
        try:
            await self._drive_traced(claim)
        except LeaseLost:
            log.warning("compensation lease lost to another replica", extra={"run_id": str(claim.run_id)})
        except KeyRefused:
            pass  # logged at error level where the gateway refused; the request waits for the key
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            # the request stays 'running' and is taken over when its lease expires; the others go on
            if store_error(exc) is None:
                loops.row_failed(LOOP, f"compensation of run {claim.run_id} (retried after its lease)", exc)
            else:
                log.warning("compensation: store unavailable", extra={"run_id": str(claim.run_id)})
        finally:
            RUN_ID.reset(token)

    async def _drive_traced(self, claim: Claim) -> None:
        """drive, as a span of the run's trace (read back from the run) while tracing is on."""
        if tracing.tracer is None:
            await self.drive(claim)
            return
        parent = await driver_sql.run_traceparent(self.pool, run_id=claim.run_id)
        attributes = {"awooop.run_id": str(claim.run_id), "awooop.trigger": claim.trigger}
        with tracing.span("awooop.saga.compensate", parent=parent, attributes=attributes):
            await self.drive(claim)

    # ---------------------------------------------------------------- one request

    async def drive(self, claim: Claim) -> None:
        for _ in range(MAX_ROUNDS):
            steps = await self._settle(claim)
            if not steps:
                return
            for step in steps:
                await self._compensate_step(claim, step)
        log.warning("compensation still has work after %d rounds; next pass continues", MAX_ROUNDS)

    def _lease(self, claim: Claim) -> Lease:
        """The fencing token's parameters: this replica holds the request at this attempt."""
        return {"run_id": claim.run_id, "worker_id": self.worker_id, "attempt": claim.attempt}

    async def _fence(self, conn: Conn, claim: Claim) -> None:
        if await driver_sql.fence_compensation_request(conn, **self._lease(claim)) is None:
            raise LeaseLost()

    async def _settle(self, claim: Claim) -> list[driver_sql.CompensatableStepsRow]:
        """Under the run and request locks: the steps left to compensate (marking the saga
        'compensating' when work starts), or, when none is left, the end of the request."""
        async with self.pool.acquire() as conn, conn.transaction():
            run = await saga_status.lock_run(conn, claim.run_id)
            await self._fence(conn, claim)
            assert run is not None  # a request names an existing run (foreign key)
            steps = await driver_sql.compensatable_steps(conn, run_id=claim.run_id)
            if steps:
                if run.saga_status in STARTS_FROM:
                    await saga_status.start(conn, claim.run_id)
                    await audit(
                        conn,
                        project_id=claim.project_id,
                        run_id=claim.run_id,
                        actor=ACTOR,
                        action=SagaAudit.STARTED,
                        from_status=run.saga_status,
                        to_status=SagaStatus.COMPENSATING,
                        reason=claim.reason,
                        details={
                            "trigger": claim.trigger,
                            "order": [s["step_id"] for s in steps],
                            "not_compensated": await self._not_compensated(conn, claim),
                        },
                    )
                await self._renew(claim, conn)
                return steps
            if run.saga_status == SagaStatus.COMPENSATING:
                final = await saga_status.end(conn, claim.run_id)
                await audit(
                    conn,
                    project_id=claim.project_id,
                    run_id=claim.run_id,
                    actor=ACTOR,
                    action=SagaAudit.ENDED,
                    from_status=SagaStatus.COMPENSATING,
                    to_status=final,
                    details={"trigger": claim.trigger},
                )
                COMPENSATION_RUNS.labels(final).inc()
            elif run.saga_status in SKIPS_FROM:
                # seed ADR-119 D6: nothing compensatable (for example a CANCELLED run with only
                # llm_call steps, or only irreversible tools) just ends; the saga says not_needed.
                await saga_status.skip(conn, claim.run_id)
                await audit(
                    conn,
                    project_id=claim.project_id,
                    run_id=claim.run_id,
                    actor=ACTOR,
                    action=SagaAudit.SKIPPED,
                    from_status=run.saga_status,
                    to_status=SagaStatus.NOT_NEEDED,
                    reason="no compensatable steps (seed ADR-119 D6)",
                    details={"trigger": claim.trigger, "not_compensated": await self._not_compensated(conn, claim)},
                )
                COMPENSATION_RUNS.labels(SKIPPED).inc()
            await driver_sql.finish_compensation_request(conn, run_id=claim.run_id)
            return []

    async def _not_compensated(self, conn: Conn, claim: Claim) -> list[dict[str, Any]]:
        rows = await driver_sql.steps_not_compensated(conn, run_id=claim.run_id)
        return [{"step_id": r["step_id"], "tool_id": r["tool_id"], "why": r["why"]} for r in rows]

    async def _renew(self, claim: Claim, conn: Conn | asyncpg.Pool | None = None) -> None:
        renewed = await driver_sql.renew_compensation_lease(
            conn or self.pool, **self._lease(claim), lease_ttl=float(self.settings.compensation_lease)
        )
        if renewed is None:
            raise LeaseLost()

    async def _compensate_step(self, claim: Claim, step: driver_sql.CompensatableStepsRow) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._renew(claim, conn)
            marked = await driver_sql.mark_step_compensating(conn, run_id=claim.run_id, step_id=step["step_id"])
        if marked is None:
            return  # resolved or changed meanwhile
        cmd = marked["compensation_cmd"]
        attributes = {"awooop.step_id": marked["step_id"], "awooop.tool_id": cmd.get("tool_id") or ""}
        with tracing.span("awooop.saga.compensate_step", attributes=attributes) as span:
            outcome = await self._call_gateway(claim, marked["step_id"], cmd)
            if span is not None:
                span.set_attribute("awooop.outcome", UndoOutcome.COMPENSATED if outcome.ok else UndoOutcome.FAILED)
                if not outcome.ok:
                    span.set_status(Status(StatusCode.ERROR, outcome.error[:256]))
        if outcome.refused:
            await driver_sql.release_compensation_request(self.pool, **self._lease(claim))
            raise KeyRefused()
        alert = False
        async with self.pool.acquire() as conn, conn.transaction():
            await self._fence(conn, claim)
            if outcome.ok:
                await self._record_compensated(conn, claim, marked, cmd, outcome)
            else:
                alert = await self._record_failed(conn, claim, marked, cmd, outcome)
        if alert:
            self.notifier.deliver_soon()

    async def _record_compensated(
        self,
        conn: Conn,
        claim: Claim,
        marked: driver_sql.MarkStepCompensatingRow,
        cmd: dict[str, Any],
        outcome: Outcome,
    ) -> None:
        """A step's undo succeeded: the step COMPENSATED (unless it changed meanwhile), audited."""
        done = await driver_sql.step_compensated(conn, run_id=claim.run_id, step_id=marked["step_id"])
        if done is not None:
            await audit(
                conn,
                project_id=claim.project_id,
                run_id=claim.run_id,
                actor=ACTOR,
                action=SagaAudit.STEP_COMPENSATED,
                from_status=StepStatus.COMPLETED,
                to_status=StepStatus.COMPENSATED,
                reason=cmd.get("reason"),
                details={
                    "step_id": marked["step_id"],
                    "tool_id": cmd.get("tool_id"),
                    "replayed": outcome.replayed,
                    "result": outcome.result or {},
                },
            )
            COMPENSATIONS.labels(UndoOutcome.REPLAYED if outcome.replayed else UndoOutcome.COMPENSATED).inc()

    async def _record_failed(
        self,
        conn: Conn,
        claim: Claim,
        marked: driver_sql.MarkStepCompensatingRow,
        cmd: dict[str, Any],
        outcome: Outcome,
    ) -> bool:
        """A step's undo failed: the step COMPENSATION_FAILED, audited, an alert row and an error
        log. Whether it was recorded (an alert to deliver)."""
        if not await driver_sql.step_compensation_failed(
            conn, run_id=claim.run_id, step_id=marked["step_id"], error=outcome.error
        ):
            return False
        # seed ADR-119 D4: a failure does not stop the others; audit + escalate
        await audit(
            conn,
            project_id=claim.project_id,
            run_id=claim.run_id,
            actor=ACTOR,
            action=SagaAudit.FAILED,
            from_status=StepStatus.COMPLETED,
            to_status=StepStatus.COMPENSATION_FAILED,
            reason=outcome.error,
            details={"step_id": marked["step_id"], "tool_id": marked["tool_id"], "compensation_cmd": cmd},
        )
        await driver_sql.insert_alert(
            conn,
            project_id=claim.project_id,
            run_id=claim.run_id,
            step_id=marked["step_id"],
            tool_id=cmd.get("tool_id"),
            error=outcome.error,
        )
        COMPENSATIONS.labels(UndoOutcome.FAILED).inc()
        # an error: a completed side effect stays in place until someone retries or resolves it
        log.error(
            "compensation failed",
            extra={
                "project_id": claim.project_id,
                "run_id": str(claim.run_id),
                "step_id": marked["step_id"],
                "tool_id": cmd.get("tool_id"),
                "error": outcome.error,
            },
        )
        return True

    # ---------------------------------------------------------------- gateway

    def _gateway(self) -> tools_pb2_grpc.ToolGatewayServiceAsyncStub:
        if self._stub is None:
            # the gateway call is a span of the run's trace (traceparent sent while tracing is on)
            self._channel = peer_channel(self.settings.gateway_addr, self.settings.tls_cert_file)
            self._stub = tools_pb2_grpc.ToolGatewayServiceStub(self._channel)
        return self._stub

    async def _call_gateway(self, claim: Claim, step_id: str, cmd: dict[str, Any]) -> Outcome:
        req = tools_pb2.ExecuteToolRequest(
            tool_id=cmd.get("tool_id") or "",
            params=to_struct(cmd.get("params") or {}),
            idempotency_key=f"{claim.run_id}:{step_id}:compensate",
            project_id=claim.project_id,
            run_id=str(claim.run_id),
            reason=cmd.get("reason") or f"SAGA compensation ({claim.trigger})",
        )
        error = ""
        for i in range(GATEWAY_TRIES):
            if i > 0:
                await self._renew(claim)  # each try may take tool_timeout; keep the claim for it
            try:
                with GATEWAY_LATENCY.time():
                    resp = await self._gateway().ExecuteTool(
                        req, timeout=self.settings.tool_timeout, metadata=self._gateway_metadata
                    )
                return Outcome(True, replayed=resp.replayed, result=struct_dict(resp.result))
            except grpc.aio.AioRpcError as exc:
                error = f"{exc.code().name}: {exc.details()}"
                if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
                    await self._refused(claim, step_id, exc.details() or "")
                    return Outcome(False, error=error[:4096], refused=True)
                if exc.code() not in TRANSIENT or i == GATEWAY_TRIES - 1:
                    break
                log.warning("gateway call failed, retrying", extra={"run_id": str(claim.run_id), "error": error})
                await asyncio.sleep(GATEWAY_BACKOFF[min(i, len(GATEWAY_BACKOFF) - 1)])
        return Outcome(False, error=error[:4096])

    async def _refused(self, claim: Claim, step_id: str, detail: str) -> None:
        """The gateway refused our key: the compensation cannot run with it. Not a failure of the
        command (nothing ran), so the step is not marked compensation_failed; the request waits,
        the saga reports NOT_SERVING and claims nothing until the key works."""
        GATEWAY_UNAUTHENTICATED.inc()
        log.error(
            "compensation of step %s refused UNAUTHENTICATED by the tool gateway at %s (%s); it waits until "
            "the key works; %s",
            step_id,
            self.settings.gateway_addr,
            detail,
            HOW,
            extra={"run_id": str(claim.run_id), "step_id": step_id},
        )
        await self.auth.refused(detail)
