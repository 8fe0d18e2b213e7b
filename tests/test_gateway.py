"""The reference ToolGateway: the seed's tools against its own state, once per idempotency key,
failures not recorded, told to fail on demand. Real Postgres, real gRPC."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import asyncpg
import grpc
from google.protobuf import json_format, struct_pb2

from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common import errors
from services.common.validate import to_struct
from tests.harness.helpers import eventually, expect_error, service_key

PROJECT = "proj"


def call(tool_id: str, key: str, params: dict[str, Any], project: str = PROJECT) -> tools_pb2.ExecuteToolRequest:
    s = struct_pb2.Struct()
    s.update(params)
    return tools_pb2.ExecuteToolRequest(tool_id=tool_id, idempotency_key=key, params=s, project_id=project)


def result(resp: tools_pb2.ExecuteToolResponse) -> dict[str, Any]:
    out: dict[str, Any] = json_format.MessageToDict(resp.result)
    return {k: int(v) if isinstance(v, float) and v.is_integer() else v for k, v in out.items()}


async def gateway(start_services: Any, channels: Any) -> tools_pb2_grpc.ToolGatewayServiceStub:
    rt = await start_services("gateway")
    return tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"], await service_key(rt)))


async def executions(db: asyncpg.Connection, key: str) -> int:
    return int(
        await db.fetchval(
            "SELECT count(*) FROM awooop_refgw_request WHERE idempotency_key = $1 AND outcome = 'executed'", key
        )
    )


async def test_seed_tools_and_their_undo_commands(start_services, channels, db) -> None:
    gw = await gateway(start_services, channels)

    created = await gw.ExecuteTool(
        call("k8s_create_resource", "k1", {"kind": "Deployment", "name": "api", "spec": {"replicas": 1}})
    )
    assert result(created) == {"kind": "Deployment", "name": "api", "created": True}
    scaled = await gw.ExecuteTool(call("k8s_scale_deployment", "k2", {"deployment": "api", "replicas": 3}))
    assert result(scaled) == {"deployment": "api", "replicas": 3, "previous_replicas": 1}
    # its undo (seed ADR-119 D3): scale back to the original value
    await gw.ExecuteTool(call("k8s_scale_deployment", "k3", {"deployment": "api", "replicas": 1}))
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 1

    await gw.ExecuteTool(call("k8s_create_resource", "k4", {"kind": "ConfigMap", "name": "cfg"}))
    gone = await gw.ExecuteTool(call("k8s_delete_resource", "k5", {"kind": "ConfigMap", "name": "cfg"}))
    assert result(gone)["deleted"] is True
    # deleting what is already gone reaches the goal: OK, deleted = false
    again = await gw.ExecuteTool(call("k8s_delete_resource", "k6", {"kind": "ConfigMap", "name": "cfg"}))
    assert result(again)["deleted"] is False
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_resource WHERE name = 'cfg'") == 0

    inserted = await gw.ExecuteTool(
        call("pg_mutate", "k7", {"op": "INSERT", "table": "incidents", "row": {"title": "db down"}})
    )
    row_id = result(inserted)["inserted_id"]
    assert await db.fetchval("SELECT data->>'title' FROM awooop_refgw_row WHERE row_id = $1", row_id) == "db down"
    deleted = await gw.ExecuteTool(call("pg_mutate", "k8", {"op": "DELETE", "table": "incidents", "id": row_id}))
    assert result(deleted)["deleted"] is True
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_row") == 0

    written = await gw.ExecuteTool(call("knowledge_write", "k9", {"content": {"text": "runbook"}}))
    entry_id = result(written)["entry_id"]
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE entry_id = $1", entry_id) == 1
    await gw.ExecuteTool(call("knowledge_delete", "k10", {"entry_id": entry_id}))
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge") == 0

    execd = await gw.ExecuteTool(call("k8s_exec_pod", "k11", {"pod": "api-0", "command": ["kill", "1"]}))
    assert result(execd)["exit_code"] == 0

    # tools act per project: the same deployment name in another project is another deployment
    await expect_error(
        gw.ExecuteTool(call("k8s_scale_deployment", "k12", {"deployment": "api", "replicas": 2}, project="other")),
        grpc.StatusCode.FAILED_PRECONDITION,
        "TOOL_FAILED",
    )


async def test_idempotency_key_runs_the_tool_once_and_replays(start_services, channels, db) -> None:
    gw = await gateway(start_services, channels)
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 1)", PROJECT)

    first = await gw.ExecuteTool(call("k8s_scale_deployment", "scale-1", {"deployment": "api", "replicas": 3}))
    assert not first.replayed
    # somebody else changes the deployment; the repeat must not run the tool again
    await db.execute("UPDATE awooop_refgw_deployment SET replicas = 7 WHERE name = 'api'")
    repeat = await gw.ExecuteTool(call("k8s_scale_deployment", "scale-1", {"deployment": "api", "replicas": 3}))
    assert repeat.replayed and result(repeat) == result(first) == {
        "deployment": "api",
        "replicas": 3,
        "previous_replicas": 1,
    }
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 7
    assert await executions(db, "scale-1") == 1

    # the key belongs to one tool
    err = await expect_error(
        gw.ExecuteTool(call("knowledge_delete", "scale-1", {"entry_id": "x"})),
        grpc.StatusCode.ALREADY_EXISTS,
        "IDEMPOTENCY_CONFLICT",
    )
    assert "scale-1" in err.details()

    # 10 callers with one key at once: one execution, nine replays
    await db.execute("UPDATE awooop_refgw_deployment SET replicas = 1 WHERE name = 'api'")
    resps = await asyncio.gather(
        *(
            gw.ExecuteTool(call("k8s_scale_deployment", "scale-2", {"deployment": "api", "replicas": 5}))
            for _ in range(10)
        )
    )
    assert sorted(r.replayed for r in resps) == [False] + [True] * 9
    assert {result(r)["previous_replicas"] for r in resps} == {1}
    assert await executions(db, "scale-2") == 1
    assert await db.fetchval("SELECT replays FROM awooop_refgw_call WHERE idempotency_key = 'scale-2'") == 9


async def test_told_to_fail_and_failures_are_not_recorded(start_services, channels, db) -> None:
    gw = await gateway(start_services, channels)
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 2)", PROJECT)

    # per call: simulate_failure
    err = await expect_error(
        gw.ExecuteTool(
            call("k8s_scale_deployment", "f1", {"deployment": "api", "replicas": 4, "simulate_failure": "api down"})
        ),
        grpc.StatusCode.FAILED_PRECONDITION,
        "TOOL_FAILED",
    )
    assert "api down" in err.details()
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 2
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_call") == 0
    # the same key runs the tool once the failure is gone (only successes are replayed)
    ok = await gw.ExecuteTool(call("k8s_scale_deployment", "f1", {"deployment": "api", "replicas": 4}))
    assert not ok.replayed and result(ok)["previous_replicas"] == 2

    # per tool: a fault row, UNAVAILABLE for the next 2 calls
    await db.execute(
        """INSERT INTO awooop_refgw_fault (project_id, tool_id, code, message, remaining)
           VALUES ('*', 'knowledge_delete', 'UNAVAILABLE', 'kb maintenance', 2)"""
    )
    for _ in range(2):
        err = await expect_error(
            gw.ExecuteTool(call("knowledge_delete", "f2", {"entry_id": "e1"})),
            grpc.StatusCode.UNAVAILABLE,
            "TOOL_FAILED",
        )
        assert errors.error_info(err).metadata["tool_id"] == "knowledge_delete"
    done = await gw.ExecuteTool(call("knowledge_delete", "f2", {"entry_id": "e1"}))
    assert not done.replayed
    outcomes = [
        r["outcome"]
        for r in await db.fetch("SELECT outcome FROM awooop_refgw_request WHERE idempotency_key = 'f2' ORDER BY 1")
    ]
    assert sorted(outcomes) == ["executed", "failed", "failed"]


async def test_bad_input_is_invalid_argument(start_services, channels, db) -> None:
    gw = await gateway(start_services, channels)
    cases = [
        (call("no_such_tool", "b1", {}), {"tool_id"}),
        (call("k8s_scale_deployment", "", {"deployment": "api", "replicas": 1}), {"idempotency_key"}),
        (call("k8s_scale_deployment", "b2", {"deployment": "api", "replicas": 1}, project=""), {"project_id"}),
        (call("k8s_scale_deployment", "b3", {"deployment": "api", "replicas": -1}), {"params.replicas"}),
        (call("k8s_scale_deployment", "b4", {"replicas": 1.5}), {"params.deployment", "params.replicas"}),
        (call("pg_mutate", "b5", {"op": "UPDATE", "table": "Robert'); DROP"}), {"params.op", "params.table"}),
        (call("pg_mutate", "b6", {"op": "DELETE", "table": "t", "id": "nope"}), {"params.id"}),
        (call("knowledge_delete", "b7", {}), {"params.entry_id"}),
        (call("k8s_create_resource", "b8", {"kind": "", "name": "a b"}), {"params.kind", "params.name"}),
        (call("k8s_exec_pod", "b9", {"pod": "p", "simulate_delay_ms": -5}), {"params.simulate_delay_ms"}),
    ]
    for req, fields in cases:
        err = await expect_error(gw.ExecuteTool(req), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID")
        br = errors.bad_request(err)
        assert br is not None and {v.field for v in br.field_violations} == fields, (fields, err.details())
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_call") == 0


async def test_a_call_whose_caller_gave_up_still_finishes_once(start_services, channels, db) -> None:
    gw = await gateway(start_services, channels)
    params = {"entry_id": "slow", "content": "x", "simulate_delay_ms": 600}
    await expect_error(
        gw.ExecuteTool(call("knowledge_write", "slow-1", params), timeout=0.1), grpc.StatusCode.DEADLINE_EXCEEDED
    )

    async def recorded() -> bool:
        return bool(await db.fetchval("SELECT count(*) FROM awooop_refgw_call WHERE idempotency_key = 'slow-1'"))

    await eventually(recorded, what="the abandoned call to finish")
    again = await gw.ExecuteTool(call("knowledge_write", "slow-1", params))
    assert again.replayed and result(again)["entry_id"] == "slow"
    assert await executions(db, "slow-1") == 1


# --- authentication and per-project scoping -----------------------------------------------------


async def test_an_empty_request_is_the_key_check_authenticated_first_and_running_nothing(
    start_services: Any, channels: Any, db: asyncpg.Connection
) -> None:
    """The saga checks its key with an empty ExecuteToolRequest (tools.proto): a refused key is
    UNAUTHENTICATED, an accepted one INVALID_ARGUMENT, and nothing is run or logged either way."""
    rt = await start_services("gateway")
    keyed = tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"], await service_key(rt)))
    wrong = (("authorization", "Bearer awk_0123456789abcdef_not-a-key"),)
    refused = tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"], wrong))
    await expect_error(refused.ExecuteTool(tools_pb2.ExecuteToolRequest()), grpc.StatusCode.UNAUTHENTICATED)
    err = await expect_error(
        keyed.ExecuteTool(tools_pb2.ExecuteToolRequest()), grpc.StatusCode.INVALID_ARGUMENT, "FIELD_INVALID"
    )
    br = errors.bad_request(err)
    assert br is not None and {"tool_id", "idempotency_key", "project_id"} <= {v.field for v in br.field_violations}
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_request") == 0
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_call") == 0


async def test_the_gateway_authenticates_and_scopes_every_record_to_the_callers_project(
    start_services: Any, channels: Any, make_key: Any, db: asyncpg.Connection
) -> None:
    rt = await start_services("gateway")
    anonymous = tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"]))
    a = tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"], await make_key("a", {"pa": ["worker"]})))
    b = tools_pb2_grpc.ToolGatewayServiceStub(channels(rt.ports["gateway"], await make_key("b", {"pb": ["worker"]})))
    run_id = str(uuid.uuid4())
    key = f"{run_id}:scale:compensate"  # predictable: what the saga will use

    def req(project: str) -> tools_pb2.ExecuteToolRequest:
        return tools_pb2.ExecuteToolRequest(
            tool_id="k8s_exec_pod",
            params=to_struct({"pod": "p", "command": "true"}),
            idempotency_key=key,
            project_id=project,
        )

    await expect_error(anonymous.ExecuteTool(req("pb")), grpc.StatusCode.UNAUTHENTICATED, "UNAUTHENTICATED")
    # a caller of project pa cannot act for pb: neither pre-record its key nor read its results
    err = await expect_error(a.ExecuteTool(req("pb")), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
    assert "pb" in err.details()
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_call WHERE project_id = 'pb'") == 0
    # in its own project the same key is its own record, which pb never sees
    first = await a.ExecuteTool(req("pa"), timeout=10)
    assert not first.replayed
    mine = await b.ExecuteTool(req("pb"), timeout=10)
    assert not mine.replayed  # ran for pb: pa's record did not answer it
    assert (await b.ExecuteTool(req("pb"), timeout=10)).replayed
    await expect_error(b.ExecuteTool(req("pa")), grpc.StatusCode.PERMISSION_DENIED, "FORBIDDEN")
