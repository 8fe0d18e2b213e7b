"""API-channel events (IngestEvent / IngestEvents with channel API, and POST
/v1/projects/{project_id}/events): seed 003's rules, the same engine as CreateRun.

- The key is scoped to (project, principal type, principal id, "ingest.IngestEvent", key):
  two principals of one project using the same key get two runs.
- The request fingerprint is SHA-256 of the canonical (project_id, input, max_attempts): the
  same key with another payload is IDEMPOTENCY_CONFLICT (409 over HTTP).
- A replay re-reads the caller's membership from the store inside the key's transaction; a
  revoked caller gets PERMISSION_DENIED (403) at once. No answer comes from Redis or the
  process's memory of recent ids, so the API-key cache opens no window for replays.

These events have no awooop_channel_event_dedupe row: their dedupe is the idempotency key
table. Keys recorded before this rule by the channel dedupe table (project, 'api', key) still
answer as duplicates for the principal that created the run, with the same fingerprint and
membership checks (the run's input and max_attempts are the fingerprint's fields); the first
such replay records the key so later replays take the ordinary path.
"""

from __future__ import annotations

import json

import asyncpg

from services.common import errors, idempotency, retry_policy
from services.common.auth import Principal, has_role_now
from services.common.db import Conn
from services.common.settings import Settings
from services.ingest import store
from services.ingest.parsing import NewEvent

OPERATION = "ingest.IngestEvent"
ROLE = "ingest"

# A key stored by the channel dedupe table before per-principal keys, still within retention.
LEGACY_SQL = """
SELECT r.run_id, r.input::text AS input, r.max_attempts
  FROM awooop_channel_event_dedupe d
  JOIN awooop_run_state r USING (run_id)
 WHERE d.project_id = $1 AND d.channel_type = 'api' AND d.provider_event_id = $2
   AND d.created_at > now() - make_interval(secs => $3) AND r.created_by = $4"""


def fingerprint(project_id: str, input_value: object, max_attempts: int) -> str:
    return idempotency.fingerprint({"project_id": project_id, "input": input_value, "max_attempts": max_attempts})


class ApiEvents:
    def __init__(self, pool: asyncpg.Pool, settings: Settings) -> None:
        self.pool = pool
        self.settings = settings
        self.defaults_json = json.dumps(retry_policy.defaults(settings))  # the service's retry policy

    async def ingest(self, event: NewEvent, principal: Principal) -> tuple[str, bool]:
        """(run_id, duplicate) for one API event; raises IDEMPOTENCY_CONFLICT or FORBIDDEN."""
        fp = fingerprint(event.project_id, json.loads(event.input_json), event.max_attempts)

        async def recheck(conn: Conn) -> bool:
            return await has_role_now(conn, principal, event.project_id, ROLE)

        async def execute(conn: Conn, window: idempotency.KeyWindow) -> idempotency.Executed:
            legacy = await conn.fetchrow(
                LEGACY_SQL,
                event.project_id,
                event.provider_event_id,
                float(self.settings.dedupe_retention),
                principal.principal_id,
            )
            if legacy is not None:
                if not await recheck(conn):
                    raise errors.forbidden(
                        f"principal {principal.principal_id} is no longer authorized for {OPERATION} "
                        f"in project {event.project_id}",
                        project_id=event.project_id,
                        operation=OPERATION,
                    )
                # the run stored its effective max_attempts; a request that leaves it unset (0)
                # asked for whatever the policy gave, so only a different explicit value differs
                asked = event.max_attempts or legacy["max_attempts"]
                legacy_fp = fingerprint(event.project_id, json.loads(legacy["input"]), legacy["max_attempts"])
                if fingerprint(event.project_id, json.loads(event.input_json), asked) != legacy_fp:
                    raise errors.idempotency_conflict(
                        "idempotency key was first used with a different payload; use a new key for a "
                        "different request",
                        differs="fingerprint",
                        operation=OPERATION,
                    )
                run_id = str(legacy["run_id"])
                return idempotency.Executed(_snapshot(run_id, legacy=True), run_id)
            run_id = str(
                await conn.fetchval(
                    store.API_EVENT_RUN_SQL,
                    event.project_id,
                    event.provider_event_id,
                    event.input_json,
                    event.max_attempts,
                    principal.principal_id,
                    principal.actor,
                    event.traceparent,
                    event.options.not_before,
                    event.options.priority,
                    event.options.retry_policy_json,
                    self.defaults_json,
                    event.options.keys_param,
                )
            )
            return idempotency.Executed(_snapshot(run_id, legacy=False), run_id)

        outcome = await idempotency.run_idempotent(
            self.pool,
            scope=idempotency.Scope(
                event.project_id, principal.principal_type, principal.principal_id, OPERATION, event.provider_event_id
            ),
            fingerprint=fp,
            policy_version=self.settings.policy_version,
            ttl=self.settings.idempotency_ttl,
            recheck=recheck,
            execute=execute,
        )
        snap = json.loads(outcome.snapshot)
        return str(snap["run_id"]), outcome.replayed or bool(snap["legacy"])


def _snapshot(run_id: str, *, legacy: bool) -> bytes:
    return json.dumps({"run_id": run_id, "legacy": legacy}).encode()
