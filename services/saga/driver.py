"""The compensation driver (seed ADR-119 D4–D6): drives every recorded compensation request to
an end, in reverse step order, through the ToolGateway contract.

Durability: requests live in awooop_compensation_request. A replica claims open ones with
FOR UPDATE SKIP LOCKED (pending, or running with an expired lease), so any number of replicas
may run this loop and a crashed replica's work is taken over after settings.compensation_lease.
The claim's fencing token is (claimed_by, attempts): every write re-checks it, so a replica that
lost its claim writes nothing.

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
from typing import Any

import asyncpg
import grpc
from opentelemetry.trace import Status, StatusCode

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common import loops, tracing
from services.common.audit import audit
from services.common.compensatable import compensatable_step
from services.common.db import Conn, store_error
from services.common.jsonvalues import struct_dict
from services.common.observability import RUN_ID
from services.common.peers import peer_channel
from services.common.runstate import COMPENSATABLE, sql_list
from services.common.runtime import AppContext
from services.common.validate import to_struct
from services.saga.gateway_auth import HOW, GatewayAuth
from services.saga.metrics import COMPENSATION_RUNS, COMPENSATIONS, GATEWAY_LATENCY, GATEWAY_UNAUTHENTICATED
from services.saga.notifier import LOOP as ALERTS_LOOP
from services.saga.notifier import Notifier
from services.saga.saga_status import SET_COMPENSATING_SQL, lock_run
from services.saga.steps import STEP_COLUMNS

log = logging.getLogger("awooop.saga.driver")

ACTOR = "service:saga"
BATCH = 10  # requests claimed per pass (driven concurrently)
LOOP = "saga_compensation"
MAX_ROUNDS = 10  # re-reads of the eligible steps per claim (retries re-open steps meanwhile)
# gateway answers worth another try before a compensation counts as failed
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED)
GATEWAY_TRIES = 3
GATEWAY_BACKOFF = (0.2, 0.5)
NOT_COMPENSATED_LISTED = 100  # cap of the list of skipped steps in the audit details

CLAIM_SQL = f"""
UPDATE awooop_compensation_request c
   SET status = 'running', claimed_by = $1, lease_until = now() + make_interval(secs => $2),
       attempts = c.attempts + 1, updated_at = now()
 WHERE c.run_id IN (
        SELECT q.run_id FROM awooop_compensation_request q
          JOIN awooop_run_state r ON r.run_id = q.run_id
         WHERE (q.status = 'pending' OR (q.status = 'running' AND q.lease_until < now()))
           AND r.status IN ({sql_list(COMPENSATABLE)})
         ORDER BY q.created_at LIMIT $3
           FOR UPDATE OF q SKIP LOCKED)
RETURNING c.run_id, c.project_id, c.trigger, c.reason, c.attempts
"""
# $1 run_id, $2 claimed_by, $3 attempts (the claim's fencing token)
FENCE_SQL = """
SELECT 1 FROM awooop_compensation_request
 WHERE run_id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'running'
   FOR UPDATE
"""
RENEW_SQL = """
UPDATE awooop_compensation_request SET lease_until = now() + make_interval(secs => $4), updated_at = now()
 WHERE run_id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'running'
RETURNING 1
"""
# the gateway refused our key: the request waits unclaimed until the key works (GatewayAuth), and
# its step left 'compensating' is called again then, with the same idempotency key
RELEASE_SQL = """
UPDATE awooop_compensation_request SET status = 'pending', claimed_by = NULL, lease_until = NULL, updated_at = now()
 WHERE run_id = $1 AND claimed_by = $2 AND attempts = $3 AND status = 'running'
"""
DONE_SQL = """
UPDATE awooop_compensation_request SET status = 'done', lease_until = NULL, updated_at = now()
 WHERE run_id = $1
"""
# A step the driver still has to compensate.
ELIGIBLE = compensatable_step()
ELIGIBLE_SQL = f"SELECT step_id, tool_id, seq FROM awooop_saga_step WHERE run_id = $1 AND {ELIGIBLE} ORDER BY seq DESC"
NOT_COMPENSATED_SQL = f"""
SELECT step_id, step_type, tool_id, status,
       CASE WHEN status = 'pending' THEN 'outcome unknown (never completed)'
            WHEN step_type <> 'tool_call' THEN step_type || ' steps are not compensated'
            ELSE 'no compensation command' END AS why
  FROM awooop_saga_step
 WHERE run_id = $1 AND status IN ('completed', 'pending') AND NOT ({ELIGIBLE})
 ORDER BY seq DESC LIMIT {NOT_COMPENSATED_LISTED}
"""
TRACEPARENT_SQL = "SELECT traceparent FROM awooop_run_state WHERE run_id = $1"
FINISH_SQL = """
UPDATE awooop_run_state
   SET saga_status = CASE WHEN EXISTS (SELECT 1 FROM awooop_saga_step
                                        WHERE run_id = $1 AND status = 'compensation_failed')
                          THEN 'compensation_failed' ELSE 'compensated' END,
       compensation_completed_at = now(), updated_at = now()
 WHERE run_id = $1
RETURNING saga_status
"""
NOT_NEEDED_SQL = "UPDATE awooop_run_state SET saga_status = 'not_needed', updated_at = now() WHERE run_id = $1"
MARK_SQL = f"""
UPDATE awooop_saga_step SET status = 'compensating'
 WHERE run_id = $1 AND step_id = $2 AND {ELIGIBLE}
RETURNING {STEP_COLUMNS}
"""
COMPENSATED_SQL = """
UPDATE awooop_saga_step SET status = 'compensated', compensated_at = now(), error = NULL
 WHERE run_id = $1 AND step_id = $2 AND status = 'compensating'
RETURNING step_id
"""
COMPENSATION_FAILED_SQL = """
UPDATE awooop_saga_step SET status = 'compensation_failed', error = $3
 WHERE run_id = $1 AND step_id = $2 AND status = 'compensating'
RETURNING step_id
"""
ALERT_SQL = """
INSERT INTO awooop_saga_alert (project_id, run_id, step_id, tool_id, error) VALUES ($1, $2, $3, $4, $5)
"""


@dataclass(frozen=True)
class Claim:
    run_id: Any
    project_id: str
    trigger: str
    reason: str | None
    token: int  # the request's attempts after this claim


@dataclass(frozen=True)
class Outcome:
    ok: bool
    replayed: bool = False
    error: str = ""
    result: dict[str, Any] | None = None
    refused: bool = False  # the gateway refused our key (UNAUTHENTICATED): nothing ran


class LostClaim(Exception):
    """Another replica took the request over (our lease expired); stop touching it."""


class KeyRefused(Exception):
    """The gateway refused AWOOOP_INTERNAL_API_KEY; the request was handed back to wait for a key."""


def replica_id() -> str:
    return f"saga-{socket.gethostname()[:60]}-{os.getpid()}-{secrets.token_hex(3)}"


class CompensationDriver:
    def __init__(self, ctx: AppContext, notifier: Notifier) -> None:
        self.ctx = ctx
        self.settings = ctx.settings
        self.pool = ctx.pool
        self.notifier = notifier
        self.me = replica_id()
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
        rows = await self.pool.fetch(CLAIM_SQL, self.me, float(self.settings.compensation_lease), BATCH)
        claims = [Claim(r["run_id"], r["project_id"], r["trigger"], r["reason"], r["attempts"]) for r in rows]
        await asyncio.gather(*(self._drive_logged(c) for c in claims))
        return len(claims)

    async def _drive_logged(self, claim: Claim) -> None:
        token = RUN_ID.set(str(claim.run_id))  # log lines of this compensation carry its run_id
        try:
            await self._drive_traced(claim)
        except LostClaim:
            log.warning("compensation claim lost to another replica", extra={"run_id": str(claim.run_id)})
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
        parent = await self.pool.fetchval(TRACEPARENT_SQL, claim.run_id)
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

    async def _fence(self, conn: Conn, claim: Claim) -> None:
        if await conn.fetchval(FENCE_SQL, claim.run_id, self.me, claim.token) is None:
            raise LostClaim()

    async def _settle(self, claim: Claim) -> list[asyncpg.Record]:
        """Under the run and request locks: the steps left to compensate (marking the saga
        'compensating' when work starts), or, when none is left, the end of the request."""
        async with self.pool.acquire() as conn, conn.transaction():
            run = await lock_run(conn, claim.run_id)
            await self._fence(conn, claim)
            assert run is not None  # a request names an existing run (foreign key)
            steps = await conn.fetch(ELIGIBLE_SQL, claim.run_id)
            if steps:
                if run.saga_status != "compensating":
                    await conn.execute(SET_COMPENSATING_SQL, claim.run_id)
                    await audit(
                        conn,
                        project_id=claim.project_id,
                        run_id=claim.run_id,
                        actor=ACTOR,
                        action="SAGA_COMPENSATION_STARTED",
                        from_status=run.saga_status,
                        to_status="compensating",
                        reason=claim.reason,
                        details={
                            "trigger": claim.trigger,
                            "order": [s["step_id"] for s in steps],
                            "not_compensated": await self._not_compensated(conn, claim),
                        },
                    )
                await conn.fetchval(
                    RENEW_SQL, claim.run_id, self.me, claim.token, float(self.settings.compensation_lease)
                )
                return list(steps)
            if run.saga_status == "compensating":
                final = await conn.fetchval(FINISH_SQL, claim.run_id)
                await audit(
                    conn,
                    project_id=claim.project_id,
                    run_id=claim.run_id,
                    actor=ACTOR,
                    action="SAGA_COMPENSATION_ENDED",
                    from_status="compensating",
                    to_status=final,
                    details={"trigger": claim.trigger},
                )
                COMPENSATION_RUNS.labels(final).inc()
            elif run.saga_status in ("in_progress", "not_needed"):
                # seed ADR-119 D6: nothing compensatable (for example a CANCELLED run with only
                # llm_call steps, or only irreversible tools) just ends; the saga says not_needed.
                await conn.execute(NOT_NEEDED_SQL, claim.run_id)
                await audit(
                    conn,
                    project_id=claim.project_id,
                    run_id=claim.run_id,
                    actor=ACTOR,
                    action="SAGA_COMPENSATION_SKIPPED",
                    from_status=run.saga_status,
                    to_status="not_needed",
                    reason="no compensatable steps (seed ADR-119 D6)",
                    details={"trigger": claim.trigger, "not_compensated": await self._not_compensated(conn, claim)},
                )
                COMPENSATION_RUNS.labels("skipped").inc()
            await conn.execute(DONE_SQL, claim.run_id)
            return []

    async def _not_compensated(self, conn: Conn, claim: Claim) -> list[dict[str, Any]]:
        rows = await conn.fetch(NOT_COMPENSATED_SQL, claim.run_id)
        return [{"step_id": r["step_id"], "tool_id": r["tool_id"], "why": r["why"]} for r in rows]

    async def _renew(self, claim: Claim, conn: Conn | asyncpg.Pool | None = None) -> None:
        renewed = await (conn or self.pool).fetchval(
            RENEW_SQL, claim.run_id, self.me, claim.token, float(self.settings.compensation_lease)
        )
        if renewed is None:
            raise LostClaim()

    async def _compensate_step(self, claim: Claim, step: asyncpg.Record) -> None:
        async with self.pool.acquire() as conn, conn.transaction():
            await self._renew(claim, conn)
            marked = await conn.fetchrow(MARK_SQL, claim.run_id, step["step_id"])
        if marked is None:
            return  # resolved or changed meanwhile
        cmd = marked["compensation_cmd"]
        attributes = {"awooop.step_id": marked["step_id"], "awooop.tool_id": cmd.get("tool_id") or ""}
        with tracing.span("awooop.saga.compensate_step", attributes=attributes) as span:
            outcome = await self._call_gateway(claim, marked["step_id"], cmd)
            if span is not None:
                span.set_attribute("awooop.outcome", "compensated" if outcome.ok else "failed")
                if not outcome.ok:
                    span.set_status(Status(StatusCode.ERROR, outcome.error[:256]))
        if outcome.refused:
            await self.pool.execute(RELEASE_SQL, claim.run_id, self.me, claim.token)
            raise KeyRefused()
        alert = False
        async with self.pool.acquire() as conn, conn.transaction():
            await self._fence(conn, claim)
            if outcome.ok:
                if await conn.fetchval(COMPENSATED_SQL, claim.run_id, marked["step_id"]) is not None:
                    await audit(
                        conn,
                        project_id=claim.project_id,
                        run_id=claim.run_id,
                        actor=ACTOR,
                        action="SAGA_STEP_COMPENSATED",
                        from_status="completed",
                        to_status="compensated",
                        reason=cmd.get("reason"),
                        details={
                            "step_id": marked["step_id"],
                            "tool_id": cmd.get("tool_id"),
                            "replayed": outcome.replayed,
                            "result": outcome.result or {},
                        },
                    )
                    COMPENSATIONS.labels("replayed" if outcome.replayed else "compensated").inc()
            elif await conn.fetchval(COMPENSATION_FAILED_SQL, claim.run_id, marked["step_id"], outcome.error):
                # seed ADR-119 D4: a failure does not stop the others; audit + escalate
                await audit(
                    conn,
                    project_id=claim.project_id,
                    run_id=claim.run_id,
                    actor=ACTOR,
                    action="SAGA_COMPENSATION_FAILED",
                    from_status="completed",
                    to_status="compensation_failed",
                    reason=outcome.error,
                    details={"step_id": marked["step_id"], "tool_id": marked["tool_id"], "compensation_cmd": cmd},
                )
                await conn.execute(
                    ALERT_SQL, claim.project_id, claim.run_id, marked["step_id"], cmd.get("tool_id"), outcome.error
                )
                COMPENSATIONS.labels("failed").inc()
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
                alert = True
        if alert:
            self.notifier.deliver_soon()

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
