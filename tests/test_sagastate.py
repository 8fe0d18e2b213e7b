"""The saga's state machines (services/common/sagastate.py) against every place that restates
them: the store's CHECK constraints and column defaults (read from the migrated store, so a status
added to a migration and not to the module, or the other way round, fails here), the protobuf
enums, the saga's statements (services/saga/*.sql) and its Python; and the compensation request's
lease, named as the run lease is."""

from __future__ import annotations

import ast
import json
import re
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
from google.protobuf.internal.enum_type_wrapper import EnumTypeWrapper

from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.tools.v1 import tools_pb2, tools_pb2_grpc
from services.common import migrate, sql
from services.common.runstate import COMPENSATABLE, TERMINAL, RunStatus, WaitStatus
from services.common.sagastate import (
    PLANNED,
    REQUEST_INITIAL,
    REQUEST_TRANSITIONS,
    SAGA_INITIAL,
    SAGA_TRANSITIONS,
    STEP_TRANSITIONS,
    RequestStatus,
    SagaStatus,
    StepAction,
    StepStatus,
    StepType,
    Transition,
    Trigger,
)
from tests.harness.helpers import ROOT, eventually, service_key
from tests.harness.saga import struct

SAGA = ROOT / "services" / "saga"
SAGA_SQL = sorted(SAGA.glob("*.sql"))

# (table, column, the declared values)
COLUMNS: list[tuple[str, str, type[StrEnum]]] = [
    ("awooop_run_state", "saga_status", SagaStatus),
    ("awooop_saga_step", "status", StepStatus),
    ("awooop_saga_step", "step_type", StepType),
    ("awooop_compensation_request", "status", RequestStatus),
    ("awooop_compensation_request", "trigger", Trigger),
    # the durable wait's (services/common/runstate.py), checked here with the other non-run statuses
    ("awooop_wait", "status", WaitStatus),
]
IDS = [f"{t}.{c}" for t, c, _ in COLUMNS]


def _values(enum: Any) -> set[str]:
    return {m.value for m in enum}


@pytest.mark.parametrize(("table", "column", "enum"), COLUMNS, ids=IDS)
async def test_each_declared_set_is_exactly_the_stores_check_constraint(
    db: Any, table: str, column: str, enum: type[StrEnum]
) -> None:
    checks = await db.fetch(
        """SELECT pg_get_constraintdef(c.oid) AS def FROM pg_constraint c
             JOIN pg_attribute a ON a.attrelid = c.conrelid AND a.attnum = ANY (c.conkey)
            WHERE c.conrelid = $1::regclass AND c.contype = 'c' AND a.attname = $2""",
        table,
        column,
    )
    assert len(checks) == 1, f"one CHECK constraint on {table}.{column}: {checks}"
    assert set(re.findall(r"'([a-z_]+)'", checks[0]["def"])) == _values(enum)


@pytest.mark.parametrize(
    ("table", "initial"),
    [("awooop_run_state", SAGA_INITIAL), ("awooop_compensation_request", REQUEST_INITIAL)],
)
async def test_a_new_row_starts_in_the_declared_initial_status(db: Any, table: str, initial: StrEnum) -> None:
    column = "saga_status" if table == "awooop_run_state" else "status"
    default = await db.fetchval(
        "SELECT column_default FROM information_schema.columns WHERE table_name = $1 AND column_name = $2",
        table,
        column,
    )
    assert re.fullmatch(r"'([a-z_]+)'::character varying", default or ""), default
    assert default.split("'")[1] == initial


@pytest.mark.parametrize(
    ("pb_enum", "prefix", "enum"),
    [
        (common_pb2.SagaStatus, "SAGA_STATUS_", SagaStatus),
        (common_pb2.StepStatus, "STEP_STATUS_", StepStatus),
        (common_pb2.StepType, "STEP_TYPE_", StepType),
        (saga_pb2.CompensationTrigger, "COMPENSATION_TRIGGER_", Trigger),
    ],
    ids=["SagaStatus", "StepStatus", "StepType", "CompensationTrigger"],
)
def test_the_protobuf_enum_names_every_value(pb_enum: EnumTypeWrapper, prefix: str, enum: type[StrEnum]) -> None:
    names = {n.removeprefix(prefix).lower() for n in pb_enum.keys()} - {"unspecified"}
    assert names == _values(enum)


@pytest.mark.parametrize(
    ("table", "statuses", "initial"),
    [
        (SAGA_TRANSITIONS, SagaStatus, SAGA_INITIAL),
        (STEP_TRANSITIONS, StepStatus, None),
        (REQUEST_TRANSITIONS, RequestStatus, None),
    ],
    ids=["saga", "step", "request"],
)
def test_every_status_is_reached_by_a_transition(
    table: dict[str, Transition[Any]], statuses: type[StrEnum], initial: StrEnum | None
) -> None:
    reached = {s for t in table.values() for s in t.to} | ({initial} if initial else set())
    assert reached == set(statuses)
    for t in table.values():
        assert all(isinstance(s, statuses) for s in (*t.allowed_from, *t.to)), t.action


# --- the statements ---------------------------------------------------------------------------

# Quoted lower-case words of the saga's statements that are not values of a declared column.
NOT_VALUES = {
    "null",  # 'null'::jsonb, a JSON null
    "synchronous_commit",  # set_config('synchronous_commit', 'off', true)
    "off",
}


def _literals(path: Path) -> list[str]:
    """The quoted literals of a statement file, comments left out."""
    text = re.sub(r"--[^\n]*", "", path.read_text(encoding="utf-8"))
    return re.findall(r"'((?:[^']|'')*)'", text)


@pytest.mark.parametrize("path", SAGA_SQL, ids=[p.name for p in SAGA_SQL])
def test_every_status_literal_of_the_sagas_statements_is_declared(path: Path) -> None:
    words = _values(SagaStatus) | _values(StepStatus) | _values(RequestStatus) | _values(StepType) | _values(Trigger)
    for literal in _literals(path):
        if re.fullmatch(r"[a-z_]+", literal):
            assert literal in words | NOT_VALUES, f"{path.name}: '{literal}' is not a declared value"
        elif re.fullmatch(r"[A-Z_]+", literal):
            assert literal in _values(RunStatus), f"{path.name}: '{literal}' is not a RunStatus"


def test_the_saga_has_statement_files() -> None:
    assert {p.name for p in SAGA_SQL} >= {"driver.sql", "journal.sql", "operator_actions.sql", "saga_status.sql"}


def test_the_driver_claims_requests_of_the_runs_a_compensation_may_be_requested_for() -> None:
    claim = sql.load(str(SAGA / "driver.py"), "driver.sql")["ClaimCompensationRequests"]
    run_lists = [set(re.findall(r"'([A-Z_]+)'", m)) for m in re.findall(r"status (?:NOT )?IN \(([^)]*)\)", claim.sql)]
    # the runs a request may be claimed for (and a parent whose tree is undone), and a child that
    # has not ended (migration 0280)
    assert {frozenset(r) for r in run_lists if r} == {frozenset(_values(COMPENSATABLE)), frozenset(_values(TERMINAL))}


def test_compensate_lists_the_planned_steps() -> None:
    planned = sql.load(str(SAGA / "operator_actions.py"), "operator_actions.sql")["PlannedSteps"]
    status_list = re.search(r"status IN \(([^)]*)\)", planned.sql)
    assert status_list is not None
    assert set(re.findall(r"'([a-z_]+)'", status_list.group(1))) == _values(PLANNED)


async def test_the_compensatable_step_function_starts_from_the_declared_statuses(db: Any) -> None:
    """awooop_step_compensatable (migration 0141) decides which steps the driver marks
    compensating: its statuses are that transition's allowed_from."""
    body = await db.fetchval("SELECT prosrc FROM pg_proc WHERE proname = 'awooop_step_compensatable'")
    status_list = re.search(r"status IN \(([^)]*)\)", body)
    assert status_list is not None, body
    marked = STEP_TRANSITIONS[StepAction.MARK_COMPENSATING].allowed_from
    assert set(re.findall(r"'([a-z_]+)'", status_list.group(1))) == _values(marked)


# --- the Python -------------------------------------------------------------------------------


def _status_constants(path: Path) -> list[str]:
    """`file:line 'value'` of every string constant equal to a saga, step or request status,
    outside the body of a StrEnum (a declaration of values)."""
    words = _values(SagaStatus) | _values(StepStatus) | _values(RequestStatus)
    tree = ast.parse(path.read_text(encoding="utf-8"))
    declared: set[int] = set()
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any(isinstance(b, ast.Name) and b.id == "StrEnum" for b in cls.bases):
            declared |= {id(n) for n in ast.walk(cls)}
    return [
        f"{path.name}:{node.lineno} {node.value!r}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and node.value in words and id(node) not in declared
    ]


def test_no_status_literal_is_left_in_the_sagas_python() -> None:
    found = [hit for path in sorted(SAGA.glob("*.py")) for hit in _status_constants(path)]
    assert found == [], "use the enums of services/common/sagastate.py"


# --- the lease --------------------------------------------------------------------------------


async def test_the_compensation_request_lease_has_the_run_lease_names_and_types(db: Any) -> None:
    rows = await db.fetch(
        """SELECT table_name, column_name, data_type, character_maximum_length FROM information_schema.columns
            WHERE table_name IN ('awooop_run_state', 'awooop_compensation_request')"""
    )
    columns = {(r["table_name"], r["column_name"]): (r["data_type"], r["character_maximum_length"]) for r in rows}
    for name in ("worker_id", "attempt_count", "lease_until"):
        assert columns[("awooop_compensation_request", name)] == columns[("awooop_run_state", name)], name
    assert ("awooop_compensation_request", "claimed_by") not in columns
    assert ("awooop_compensation_request", "attempts") not in columns


async def test_a_request_held_across_the_rename_is_taken_over_and_its_undo_runs_once(
    start_services: Any, channels: Any, db: Any
) -> None:
    """Migration 0140 renames the lease columns in place. A saga replica of the earlier version
    that held a request when it was stopped for the upgrade (its step left `compensating`, its
    gateway call made) is taken over by a new one when the lease expires: the step is undone once
    (the gateway replays the call the old replica made), and the new lease is the next attempt."""
    # the store before 0140: the two columns under their old names
    await db.execute(
        """ALTER TABLE awooop_compensation_request RENAME COLUMN worker_id TO claimed_by;
           ALTER TABLE awooop_compensation_request RENAME COLUMN attempt_count TO attempts;
           DELETE FROM awooop_schema_migrations WHERE version = 140"""
    )
    gw_rt = await start_services("gateway")
    gw = tools_pb2_grpc.ToolGatewayServiceStub(channels(gw_rt.ports["gateway"], await service_key(gw_rt)))
    await db.execute("INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ('p', 'api', 1)")
    run_id = await db.fetchval(
        "INSERT INTO awooop_run_state (project_id, channel_type, status, attempt_count) "
        "VALUES ('p', 'api', 'FAILED', 1) RETURNING run_id"
    )
    undo = {"tool_id": "k8s_scale_deployment", "params": {"deployment": "api", "replicas": 1}}
    await db.execute(
        """INSERT INTO awooop_saga_step (run_id, step_id, project_id, seq, step_type, tool_id, status,
                                         compensation_cmd, attempt, completed_at)
           VALUES ($1, 'scale', 'p', 1, 'tool_call', 'k8s_scale_deployment', 'compensating', $2, 1, now())""",
        run_id,
        json.dumps(undo),
    )
    await db.execute("UPDATE awooop_run_state SET saga_status = 'compensating' WHERE run_id = $1", run_id)
    # the old replica's call went through (the deployment was at 3), then it was stopped
    await db.execute("UPDATE awooop_refgw_deployment SET replicas = 3 WHERE name = 'api'")
    key = f"{run_id}:scale:compensate"
    await gw.ExecuteTool(
        tools_pb2.ExecuteToolRequest(
            tool_id="k8s_scale_deployment", params=struct(undo["params"]), idempotency_key=key, project_id="p"
        )
    )
    await db.execute(
        """INSERT INTO awooop_compensation_request
                  (run_id, project_id, trigger, status, claimed_by, lease_until, attempts)
           VALUES ($1, 'p', 'step_failed', 'running', 'saga-old', now() + interval '1 second', 1)""",
        run_id,
    )

    assert [m for m in await migrate.apply(db) if m.startswith("0140")] == ["0140_compensation_lease_names.sql"]
    assert dict(
        await db.fetchrow("SELECT worker_id, attempt_count FROM awooop_compensation_request WHERE run_id = $1", run_id)
    ) == {"worker_id": "saga-old", "attempt_count": 1}

    gw_addr = f"127.0.0.1:{gw_rt.ports['gateway']}"
    await start_services("saga", gateway_addr=gw_addr, compensation_interval=0.2)

    async def done() -> bool:
        status = await db.fetchval("SELECT status FROM awooop_compensation_request WHERE run_id = $1", run_id)
        return bool(status == RequestStatus.DONE)

    await eventually(done, timeout=20, what="the new saga to take the request over and finish it")
    req = await db.fetchrow(
        "SELECT worker_id, attempt_count FROM awooop_compensation_request WHERE run_id = $1", run_id
    )
    assert req["worker_id"] != "saga-old" and req["attempt_count"] == 2
    assert await db.fetchval("SELECT status FROM awooop_saga_step WHERE run_id = $1", run_id) == StepStatus.COMPENSATED
    assert await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id) == (
        SagaStatus.COMPENSATED
    )
    outcomes = await db.fetch(
        "SELECT outcome FROM awooop_refgw_request WHERE idempotency_key = $1 ORDER BY request_id", key
    )
    assert [r["outcome"] for r in outcomes] == ["executed", "replayed"]
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE name = 'api'") == 1
