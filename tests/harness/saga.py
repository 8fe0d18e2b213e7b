"""Saga test harness: runs claimed and reaped as the scheduler does it, a saga stub, and the
check of the seed's saga_steps format."""

from __future__ import annotations

import datetime as dt
import json
from typing import Any

import asyncpg
import grpc
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2_grpc
from services.common import errors

PROJECT = "proj"
TOOL = common_pb2.STEP_TYPE_TOOL_CALL
LLM = common_pb2.STEP_TYPE_LLM_CALL


def struct(data: dict[str, Any] | None = None) -> struct_pb2.Struct:
    s = struct_pb2.Struct()
    s.update(data or {})
    return s


def lease(run_id: str, attempt: int) -> common_pb2.LeaseToken:
    return common_pb2.LeaseToken(run_id=run_id, attempt=attempt)


async def new_run(db: asyncpg.Connection, project: str = PROJECT, max_attempts: int = 3) -> str:
    """A PENDING run as the ingest service creates it (3 attempts: the default)."""
    return str(
        await db.fetchval(
            """INSERT INTO awooop_run_state (project_id, channel_type, max_attempts) VALUES ($1, 'api', $2)
               RETURNING run_id""",
            project,
            max_attempts,
        )
    )


async def claim(db: asyncpg.Connection, run_id: str, worker: str = "w1") -> int:
    """A claim as the scheduler makes it (RUNNING, attempt_count + 1, lease); returns the fencing token."""
    return int(
        await db.fetchval(
            """UPDATE awooop_run_state
                  SET status = 'RUNNING', attempt_count = attempt_count + 1, worker_id = $2,
                      lease_until = now() + interval '1 minute', heartbeat_at = now(), updated_at = now()
                WHERE run_id = $1 AND status IN ('PENDING', 'RESUMED')
            RETURNING attempt_count""",
            run_id,
            worker,
        )
    )


async def reap(db: asyncpg.Connection, run_id: str) -> None:
    """What the reaper does to an expired lease with attempts left."""
    await db.execute(
        """UPDATE awooop_run_state SET status = 'PENDING', lease_until = NULL, worker_id = NULL, reaped_at = now()
            WHERE run_id = $1 AND status IN ('RUNNING', 'WAITING_TOOL')""",
        run_id,
    )


async def saga_stub(start_services: Any, channels: Any, **overrides: Any) -> saga_pb2_grpc.SagaServiceStub:
    rt = await start_services("saga", **overrides)
    return saga_pb2_grpc.SagaServiceStub(channels(rt.ports["saga"]))


def field_names(err: grpc.aio.AioRpcError) -> set[str]:
    br = errors.bad_request(err)
    return {v.field for v in br.field_violations} if br else set()


# seed ADR-119 D1, checked by hand (no schema library): the keys, their types and the enumerations
SEED_KEYS = {
    "step_id",
    "step_type",
    "tool_id",
    "tool_params",
    "status",
    "result",
    "compensation_cmd",
    "started_at",
    "completed_at",
    "error",
}
SEED_STEP_TYPES = {"llm_call", "tool_call", "approval_request", "callback"}
SEED_STATUSES = {"pending", "completed", "failed", "compensating", "compensated", "compensation_failed", "resolved"}


def check_seed_format(saga_steps_json: str) -> list[dict[str, Any]]:
    steps = json.loads(saga_steps_json)
    assert isinstance(steps, list)
    for s in steps:
        assert isinstance(s, dict)
        assert set(s) <= SEED_KEYS, f"unexpected keys {set(s) - SEED_KEYS}"
        assert {"step_id", "step_type", "status", "started_at"} <= set(s)
        assert isinstance(s["step_id"], str) and s["step_id"]
        assert s["step_type"] in SEED_STEP_TYPES
        assert s["status"] in SEED_STATUSES
        for key in ("tool_params", "result"):
            assert key not in s or isinstance(s[key], dict)
        if "tool_id" in s:
            assert isinstance(s["tool_id"], str)
        if "compensation_cmd" in s:
            cmd = s["compensation_cmd"]
            assert s["step_type"] == "tool_call"
            assert set(cmd) == {"tool_id", "params", "reason"}
            assert isinstance(cmd["tool_id"], str) and isinstance(cmd["params"], dict)
        for key in ("started_at", "completed_at"):
            if key in s:
                parsed = dt.datetime.fromisoformat(s[key])  # ISO 8601
                assert parsed.tzinfo is not None
        if s["status"] in ("completed", "failed"):
            assert "completed_at" in s
        if s["status"] == "pending":
            assert "completed_at" not in s and "result" not in s
    return steps
