"""StartChildRuns: validate the children, call children.start, build the answer (each child's
state and the CHILDREN wait, fitted to the message limit)."""

from __future__ import annotations

import json

import asyncpg

from awooop.scheduler.v1 import scheduler_pb2
from services.common import retry_policy, run_options, tracing
from services.common.auth import current_principal
from services.common.db import Row
from services.common.limits import MAX_ATTEMPTS_LIMIT, MAX_CHILDREN_PER_CALL, MAX_ID
from services.common.settings import Settings
from services.common.validate import Violations, to_struct
from services.scheduler import budget, children
from services.scheduler.rpc_fields import MAX_WAIT_TIMEOUT, lease, status_of
from services.scheduler.wait_rpcs import wait_pb

MAX_CHILD_REASON = 512  # a child's failure_reason in StartChildRuns' answer (GetRun has it whole)


class ChildRpcs:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self._policy_defaults = json.dumps(retry_policy.defaults(settings))

    async def start_child_runs(
        self, request: scheduler_pb2.StartChildRunsRequest
    ) -> scheduler_pb2.StartChildRunsResponse:
        v = Violations()
        run_id, attempt = lease(v, "lease", request.lease)
        specs = self._child_specs(v, request)
        wait_step_id = v.token("wait_step_id", request.wait_step_id, max_len=MAX_ID, required=False) or None
        timeout = MAX_WAIT_TIMEOUT
        if request.HasField("timeout"):
            timeout = request.timeout.seconds + request.timeout.nanos / 1e9
            v.check(0 < timeout <= MAX_WAIT_TIMEOUT, "timeout", f"between 0 and {MAX_WAIT_TIMEOUT:g} seconds")
        v.raise_if_any()
        rows = await children.start(
            self.pool,
            self.settings,
            current_principal(),
            run_id,
            attempt,
            specs,
            policy_defaults=self._policy_defaults,
            traceparent=tracing.current_traceparent(),
            wait_step_id=wait_step_id,
            fail_fast=request.fail_fast,
            timeout=timeout,
        )
        return self._answer(rows, run_id)

    def _child_specs(self, v: Violations, request: scheduler_pb2.StartChildRunsRequest) -> list[children.ChildSpec]:
        """The children of the request, validated (violations recorded in v)."""
        n = len(request.children)
        v.check(0 < n <= MAX_CHILDREN_PER_CALL, "children", f"1 to {MAX_CHILDREN_PER_CALL} children per call, got {n}")
        specs: list[children.ChildSpec] = []
        seen: set[str] = set()
        for i, c in enumerate(request.children[:MAX_CHILDREN_PER_CALL]):
            prefix = f"children[{i}]."
            step_id = v.token(prefix + "step_id", c.step_id, max_len=MAX_ID)
            v.check(step_id not in seen, prefix + "step_id", "named twice in this call")
            seen.add(step_id)
            options = run_options.parse(
                v,
                prefix,
                not_before=c.not_before if c.HasField("not_before") else None,
                priority=c.priority,
                policy=None,
                concurrency_keys=c.concurrency_keys,
                required_labels=c.required_labels,
                preferred_labels=c.preferred_labels,
            )
            v.check(0 <= c.max_attempts <= MAX_ATTEMPTS_LIMIT, prefix + "max_attempts", f"0 to {MAX_ATTEMPTS_LIMIT}")
            value = v.struct(prefix + "input", c.input, max_bytes=self.settings.max_payload_bytes)
            specs.append(
                children.ChildSpec(
                    step_id,
                    value,
                    options.priority,
                    options.not_before,
                    options.concurrency_keys,
                    c.max_attempts,
                    options.required_labels_json,
                    options.preferred_labels_json,
                )
            )
        return specs

    def _answer(self, rows: list[Row], run_id: str) -> scheduler_pb2.StartChildRunsResponse:
        resp = scheduler_pb2.StartChildRunsResponse()
        for r in rows:
            child = resp.children.add(
                step_id=r["step_id"],
                run_id=str(r["run_id"]),
                status=status_of(r["status"]),
                # its start only: a thousand children's whole reasons could pass the message limit
                failure_reason=(r["failure_reason"] or "")[:MAX_CHILD_REASON],
                error_code=r["error_code"] or "",
                started=r["started"],
            )
            if r["output"] is not None:
                child.output.CopyFrom(to_struct(r["output"]))
        budget.fit_children(resp.children, budget.answer_budget(self.settings.max_message_bytes))
        first = rows[0]
        if first["wait_id"] is not None:
            resp.wait.CopyFrom(wait_pb(first, run_id=run_id, project_id="", status=first["wait_status"]))
            resp.wait.step_id = first["wait_step_id"]
        return resp
