"""The callback URL of a durable wait token: `POST /v1/waits/<token>` with a JSON object body
completes the wait with that body as its result (docs/worker-sdk.md, "Durable waits").

The token is the credential, like an approval link's: unguessable (32 random bytes), stored
only as its sha256, single use (the wait's first outcome stands; a second POST is 409 naming
it). Answers: 200 {wait_id, run_id, status, resumed}; 404 for a token no wait has; 409
WAIT_CLOSED when the wait already ended or its run is over; 400 for a body that is not a JSON
object under the JSON value rules. The scheduler's CompleteWait RPC ends waits by the same
SQL function, so a callback racing an RPC, the timeout sweep or a cancel has one winner.
"""

from __future__ import annotations

import hashlib
from typing import Any

import asyncpg
from aiohttp import web

from services.common import errors, jsonvalues, wait_outcomes
from services.common.settings import Settings
from services.ingest import wait_callbacks_sql
from services.ingest.http import parse_body, problem

ROUTE = "/v1/waits/{token}"
ACTOR = "callback:wait-url"
MAX_TOKEN = 256


def add_routes(app: web.Application, pool: asyncpg.Pool, settings: Settings) -> None:
    """Registers the callback route on ingest's HTTP app."""

    async def complete(request: web.Request) -> web.Response:
        token = request.match_info["token"]
        if not 0 < len(token) <= MAX_TOKEN:
            raise errors.not_found("wait", "(token)")
        result = parse_body(await request.read(), "body")
        try:
            jsonvalues.check_plain(result, settings.max_step_result_bytes)
        except jsonvalues.JsonValueError as exc:
            raise errors.invalid([("body", str(exc))]) from None
        digest = hashlib.sha256(token.encode()).digest()
        row = await wait_callbacks_sql.complete_wait_by_token(pool, result=result, actor=ACTOR, token_hash=digest)
        if row is None:
            raise errors.not_found("wait", "(token)")
        try:
            return web.json_response(answer(row))
        except errors.ServiceError as exc:
            if exc.reason not in (errors.WAIT_CLOSED, errors.INVALID_TRANSITION):
                raise
            # FAILED_PRECONDITION over gRPC; over HTTP the state conflicts with the request
            return problem(409, exc.message, reason=exc.reason, extra=exc.metadata)

    app.router.add_post(ROUTE, complete)


def answer(row: wait_callbacks_sql.CompleteWaitByTokenRow) -> dict[str, Any]:
    """The decided wait, or the one rule's refusal (wait_outcomes.ended raises it)."""
    wait_id = str(row["wait_id"])
    wait_outcomes.ended(row, wait_id)
    return {"wait_id": wait_id, "run_id": str(row["run_id"]), "status": row["wait_status"], "resumed": row["resumed"]}
