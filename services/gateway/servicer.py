"""The reference ToolGateway: ExecuteTool once per (project_id, idempotency_key).

Per call: the request is logged (awooop_refgw_request), then ONE transaction takes an advisory
lock on the key, replays a recorded success (replayed = true, nothing runs), or runs the tool
and records the key with its result. Failures are not recorded, so a retry with the same key
runs the tool again. The work is shielded from caller cancellation: like a real tool, a call
whose caller died still finishes, and the caller's retry gets the replay.

Told to fail: a param "simulate_failure": "<message>" fails that call (FAILED_PRECONDITION,
TOOL_FAILED); rows of awooop_refgw_fault fail every call of a tool (with their code) while they
last. "simulate_delay_ms": N makes the call take N ms longer (at most 60000).

A parked tool call (a request with callback_url, docs/worker-sdk.md "Parked tool calls") is a
tool that completes later: answered at once, run in the background the same way, its outcome
posted to the URL (callbacks.py). Its in-flight state is this process's: a gateway that stops
drops the calls still at work (as a crashed tool would), and their waits time out.

Callers authenticate like at every service (an API key) and need a role in the project they
act for (the saga presents AWOOOP_INTERNAL_API_KEY, a service key with a role in every project);
the recorded keys and results are per project.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import asyncpg
import grpc
from prometheus_client import Counter

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common import errors
from services.common.auth import current_principal
from services.common.db import Conn
from services.common.limits import MAX_ID, MAX_IDEMPOTENCY_KEY, MAX_TEXT, MAX_URL
from services.common.observability import preset
from services.common.validate import Violations, to_struct
from services.gateway import servicer_sql
from services.gateway.callbacks import CallbackPoster
from services.gateway.tools import TOOLS, tool_failed

log = logging.getLogger("awooop.gateway")

CALLS = Counter("awooop_gateway_calls_total", "Reference gateway calls by tool and outcome", ["tool_id", "outcome"])
preset(CALLS, (*TOOLS, "unknown"), ("executed", "replayed", "error"))
MAX_DELAY_MS = 60000


@dataclass(frozen=True)
class ToolCall:
    """An ExecuteToolRequest, checked."""

    project_id: str
    key: str
    tool_id: str
    run_id: str | None
    reason: str
    params: dict[str, Any]
    delay_ms: float
    simulated: Any
    callback_url: str


class GatewayServicer(tools_pb2_grpc.ToolGatewayServiceServicer):
    def __init__(self, pool: asyncpg.Pool, max_params_bytes: int) -> None:
        self.pool = pool
        self.max_params_bytes = max_params_bytes
        self._inflight: set[asyncio.Task[Any]] = set()
        # parked tool calls at work: (project_id, idempotency_key) -> the URL their outcome goes to
        self._parked: dict[tuple[str, str], str] = {}
        self._parked_tasks: set[asyncio.Task[None]] = set()
        self.poster = CallbackPoster()

    async def ExecuteTool(
        self, request: tools_pb2.ExecuteToolRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> Any:
        tool_id = request.tool_id if request.tool_id in TOOLS else "unknown"
        try:
            call = self._parse(request)
        except Exception:
            CALLS.labels(tool_id, "error").inc()
            raise  # the shared interceptor maps ServiceError / store errors to rich statuses
        if call.callback_url:
            return self._accept(call)
        task = asyncio.ensure_future(self._execute(call))
        self._inflight.add(task)
        task.add_done_callback(self._done)
        try:
            # the caller going away cancels this await, not the task: the call finishes regardless
            result, replayed = await asyncio.shield(task)
        except asyncio.CancelledError:
            raise
        except Exception:
            CALLS.labels(tool_id, "error").inc()
            raise
        CALLS.labels(tool_id, "replayed" if replayed else "executed").inc()
        return tools_pb2.ExecuteToolResponse(result=to_struct(result), replayed=replayed)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._inflight.discard(task)
        if not task.cancelled():
            task.exception()  # retrieved: an abandoned call's failure is logged in its request row

    async def close(self) -> None:
        await asyncio.gather(*self._inflight, return_exceptions=True)
        # parked calls still at work are dropped, as a crashed tool's are: their waits time out
        for task in list(self._parked_tasks):
            task.cancel()
        if self._parked_tasks:
            log.warning("gateway stopping: %d parked tool calls dropped", len(self._parked_tasks))
        await asyncio.gather(*self._parked_tasks, return_exceptions=True)
        await self.poster.close()

    def _parse(self, request: tools_pb2.ExecuteToolRequest) -> ToolCall:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        key = v.token("idempotency_key", request.idempotency_key, max_len=MAX_IDEMPOTENCY_KEY)
        tool_id = v.token("tool_id", request.tool_id, max_len=MAX_ID)
        if tool_id and tool_id not in TOOLS:
            v.add("tool_id", f"unknown tool; one of {', '.join(sorted(TOOLS))}")
        run_id = v.uuid("run_id", request.run_id) if request.run_id else None
        reason = v.text("reason", request.reason, max_len=MAX_TEXT)
        params = v.struct("params", request.params, max_bytes=self.max_params_bytes)
        delay = params.pop("simulate_delay_ms", 0)
        if not isinstance(delay, int | float) or not 0 <= delay <= MAX_DELAY_MS:
            v.add("params.simulate_delay_ms", f"between 0 and {MAX_DELAY_MS}")
            delay = 0
        simulated = params.pop("simulate_failure", None)
        url = request.callback_url
        if url and (len(url) > MAX_URL or urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).netloc):
            v.add("callback_url", f"an absolute http(s) URL of at most {MAX_URL} characters")
        v.raise_if_any()
        # a caller acts for projects it has a role in (a service key with a "*" role: all of them);
        # records are per project, so nobody reads or pre-records another project's keys
        principal = current_principal()
        if not principal.member_of(project_id):  # the tool role only posts results
            raise errors.forbidden(
                f"principal {principal.principal_id} has no role in project {project_id}", project_id=project_id
            )
        return ToolCall(project_id, key, tool_id, run_id, reason, params, delay, simulated, url)

    def _accept(self, call: ToolCall) -> tools_pb2.ExecuteToolResponse:
        """A parked tool call: answered at once, its outcome posted to call.callback_url when done.
        A repeat of one still at work runs nothing: the outcome goes to the newest URL (the run's
        next attempt got a new callback token)."""
        at_work = (call.project_id, call.key) in self._parked
        self._parked[(call.project_id, call.key)] = call.callback_url
        if not at_work:
            task = asyncio.ensure_future(self._execute_and_post(call))
            self._parked_tasks.add(task)
            task.add_done_callback(self._parked_tasks.discard)
        return tools_pb2.ExecuteToolResponse(accepted=True, replayed=at_work)

    async def _execute_and_post(self, call: ToolCall) -> None:
        body: dict[str, Any]
        try:
            result, replayed = await self._execute(call)
            body = {"result": result}
            CALLS.labels(call.tool_id, "replayed" if replayed else "executed").inc()
        except errors.ServiceError as exc:
            body = {"error": exc.message, "code": exc.reason}
            CALLS.labels(call.tool_id, "error").inc()
        except Exception as exc:
            log.exception("parked tool call %s failed", call.key)
            body = {"error": f"{type(exc).__name__}: {exc}"[:MAX_TEXT], "code": errors.TOOL_FAILED}
            CALLS.labels(call.tool_id, "error").inc()
        url = self._parked.pop((call.project_id, call.key))
        await self.poster.post(url, body)

    async def _execute(self, call: ToolCall) -> tuple[dict[str, Any], bool]:
        project_id, key, tool_id = call.project_id, call.key, call.tool_id
        request_id = await servicer_sql.log_request(
            self.pool, project_id=project_id, idempotency_key=key, tool_id=tool_id
        )
        try:
            result, replayed = await self._once(
                project_id, key, tool_id, call.params, call.run_id, call.reason, call.delay_ms, call.simulated
            )
        except errors.ServiceError as exc:
            await self._outcome(request_id, "failed", exc.message)
            raise
        except BaseException as exc:
            await asyncio.shield(self._log_failure(request_id, repr(exc)))
            raise
        await self._outcome(request_id, "replayed" if replayed else "executed", None)
        return result, replayed

    async def _outcome(self, request_id: int, outcome: str, error: str | None) -> None:
        await servicer_sql.record_outcome(self.pool, request_id=request_id, outcome=outcome, error=error)

    async def _log_failure(self, request_id: int, text: str) -> None:
        try:
            await self._outcome(request_id, "failed", text[:4096])
        except Exception:
            log.warning("could not record a failed gateway call", exc_info=True)

    async def _once(
        self,
        project_id: str,
        key: str,
        tool_id: str,
        params: dict[str, Any],
        run_id: str | None,
        reason: str,
        delay_ms: float,
        simulated: Any,
    ) -> tuple[dict[str, Any], bool]:
        if delay_ms:
            await asyncio.sleep(delay_ms / 1000)
        async with self.pool.acquire() as conn:
            async with conn.transaction():
                recorded = await _lock_and_read(conn, project_id, key)
                if recorded is not None:
                    if recorded["tool_id"] != tool_id:
                        raise errors.idempotency_conflict(
                            f"idempotency key {key} was used for {recorded['tool_id']}, not {tool_id}",
                            idempotency_key=key,
                        )
                    await servicer_sql.count_replay(conn, project_id=project_id, idempotency_key=key)
                    return recorded["result"], True
            # injected faults are consumed outside the tool's transaction so the count survives the failure
            fault = await servicer_sql.take_fault(conn, project_id=project_id, tool_id=tool_id)
            if fault is not None:
                code = getattr(grpc.StatusCode, fault["code"])
                raise errors.ServiceError(code, errors.TOOL_FAILED, fault["message"], metadata={"tool_id": tool_id})
            if simulated is not None:
                raise tool_failed(str(simulated) or "simulated failure", tool_id=tool_id, simulated="true")
            async with conn.transaction():
                recorded = await _lock_and_read(conn, project_id, key)
                if recorded is not None:  # a concurrent call with the same key ran it meanwhile
                    await servicer_sql.count_replay(conn, project_id=project_id, idempotency_key=key)
                    return recorded["result"], True
                result = await TOOLS[tool_id](conn, project_id, params)
                await servicer_sql.record_call(
                    conn,
                    project_id=project_id,
                    idempotency_key=key,
                    tool_id=tool_id,
                    params=params,
                    result=result,
                    run_id=run_id,
                    reason=reason or None,
                )
                return result, False


async def _lock_and_read(conn: Conn, project_id: str, key: str) -> servicer_sql.RecordedCallRow | None:
    """Takes the key's lock for the transaction, then reads its recorded success (if any)."""
    await servicer_sql.lock_key(conn, lock_name=f"{project_id}/{key}")
    return await servicer_sql.recorded_call(conn, project_id=project_id, idempotency_key=key)
