"""CreateRun: an API run created through the idempotent-mutation engine (seed 003).

The key is scoped to (project, principal type, principal id, "ingest.CreateRun", key), so two
principals using the same key never see each other's runs. The run gets channel "api" and no
provider_event_id: its dedupe is the idempotency key table, not the channel dedupe table (the
key is recorded in the RUN_CREATED audit row). The stored snapshot is the serialized
CreateRunResponse of the first call; a replay returns it with replayed = true.
"""

from __future__ import annotations

import json

import asyncpg

from awooop.ingest.v1 import ingest_pb2
from services.common import errors, idempotency, retry_policy, tracing
from services.common.auth import Principal, has_role_now
from services.common.db import Conn
from services.common.run_options import RunOptions
from services.common.runs import run_to_pb, ts
from services.common.settings import Settings
from services.ingest import metrics, store
from services.ingest.parsing import NewRun
from services.ingest.wakeup import Notifier

OPERATION = "ingest.CreateRun"
ROLE = "ingest"


def request_fingerprint(run: NewRun) -> str:
    """SHA-256 of the canonical fields that define the mutation (never the key itself)."""
    o = run.options
    fields = {"project_id": run.project_id, "input": run.input, "max_attempts": run.max_attempts}
    if o != RunOptions():  # runs without flow options keep the fingerprint they always had
        when = o.not_before.isoformat() if o.not_before else None
        # one key: the fingerprint a run with that key always had
        keys: str | list[str] | None = (
            list(o.concurrency_keys)
            if len(o.concurrency_keys) > 1
            else (o.concurrency_keys[0] if o.concurrency_keys else None)
        )
        fields["flow"] = [when, o.priority, o.retry_policy_json, keys]
    return idempotency.fingerprint(fields)


class RunCreator:
    def __init__(self, pool: asyncpg.Pool, settings: Settings, notifier: Notifier) -> None:
        self.pool = pool
        self.settings = settings
        self.notifier = notifier

    async def create(
        self, run: NewRun, principal: Principal, *, deadline: float | None
    ) -> ingest_pb2.CreateRunResponse:
        traceparent = tracing.current_traceparent()  # the run's trace continues this RPC's span

        async def recheck(conn: Conn) -> bool:
            return await has_role_now(conn, principal, run.project_id, ROLE)

        async def execute(conn: Conn, window: idempotency.KeyWindow) -> idempotency.Executed:
            row = await store.create_run(
                conn,
                run,
                principal_id=principal.principal_id,
                actor=principal.actor,
                defaults_json=json.dumps(retry_policy.defaults(self.settings)),
                traceparent=traceparent,
            )
            response = ingest_pb2.CreateRunResponse(
                run=run_to_pb(row),
                replayed=False,
                key_created_at=ts(window.created_at),
                key_expires_at=ts(window.expires_at),
            )
            return idempotency.Executed(response.SerializeToString(), str(row["run_id"]))

        try:
            outcome = await idempotency.run_idempotent(
                self.pool,
                scope=idempotency.Scope(
                    run.project_id, principal.principal_type, principal.principal_id, OPERATION, run.key
                ),
                fingerprint=request_fingerprint(run),
                policy_version=self.settings.policy_version,
                ttl=self.settings.idempotency_ttl,
                deadline=deadline,
                recheck=recheck,
                execute=execute,
            )
        except errors.ServiceError as exc:
            outcome_label = {errors.IDEMPOTENCY_CONFLICT: "conflict", errors.FORBIDDEN: "forbidden"}.get(exc.reason)
            if outcome_label or exc.reason == errors.DEADLINE_EXCEEDED:
                metrics.CREATE_RUN.labels(outcome_label or "deadline").inc()
            raise
        if not outcome.replayed:
            self.notifier.ready((run.project_id,))
        response = ingest_pb2.CreateRunResponse.FromString(outcome.snapshot)
        response.replayed = outcome.replayed
        metrics.CREATE_RUN.labels("replayed" if outcome.replayed else "created").inc()
        return response
