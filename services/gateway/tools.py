"""The reference gateway's tools (seed ADR-119 D3), acting on its own tables instead of a
cluster, a database and a knowledge base. Each runs inside the gateway's per-call transaction.

| tool                  | params                                  | result                                        |
|-----------------------|-----------------------------------------|-----------------------------------------------|
| k8s_scale_deployment  | deployment, replicas                    | deployment, replicas, previous_replicas       |
| k8s_create_resource   | kind, name, spec? (Deployment: replicas)| kind, name, created                           |
| k8s_delete_resource   | kind, name                              | kind, name, deleted                           |
| pg_mutate             | op INSERT + table + row / op DELETE + id| table, inserted_id / deleted                  |
| knowledge_write       | content, entry_id?                      | entry_id, created                             |
| knowledge_delete      | entry_id                                | entry_id, deleted                             |
| k8s_exec_pod          | pod, command (irreversible)             | pod, exit_code, output                        |
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from services.common import errors
from services.common.db import Conn
from services.common.validate import TOKEN_RE, Violations
from services.gateway import tools_sql

NAME_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,251}[A-Za-z0-9])?$")  # k8s-style names and kinds
TABLE_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
MAX_REPLICAS = 10000

Tool = Callable[[Conn, str, dict[str, Any]], Awaitable[dict[str, Any]]]


def tool_failed(message: str, **metadata: str) -> errors.ServiceError:
    return errors.ServiceError(grpc.StatusCode.FAILED_PRECONDITION, errors.TOOL_FAILED, message, metadata=metadata)


def _name(v: Violations, params: dict[str, Any], key: str) -> str:
    value = params.get(key)
    if not isinstance(value, str) or not NAME_RE.match(value):
        v.add(f"params.{key}", "required: 1-253 chars of letters, digits, '.', '_', '-'")
        return ""
    return value


def _int(v: Violations, params: dict[str, Any], key: str, lo: int, hi: int, default: int | None = None) -> int:
    value = params.get(key, default)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
        v.add(f"params.{key}", f"required: an integer between {lo} and {hi}")
        return 0
    return value


async def k8s_scale_deployment(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    name = _name(v, params, "deployment")
    replicas = _int(v, params, "replicas", 0, MAX_REPLICAS)
    v.raise_if_any()
    previous = await tools_sql.lock_deployment(conn, project_id=project_id, name=name)
    if previous is None:
        raise tool_failed(f"deployment {name} not found", deployment=name)
    await tools_sql.scale_deployment(conn, project_id=project_id, name=name, replicas=replicas)
    return {"deployment": name, "replicas": replicas, "previous_replicas": previous}


async def k8s_create_resource(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    kind = _name(v, params, "kind")
    name = _name(v, params, "name")
    spec = params.get("spec", {})
    if not isinstance(spec, dict):
        v.add("params.spec", "must be an object")
    replicas = _int(v, spec if isinstance(spec, dict) else {}, "replicas", 0, MAX_REPLICAS, default=1)
    v.raise_if_any()
    created = await tools_sql.create_resource(conn, project_id=project_id, kind=kind, name=name, spec=spec)
    if not created:
        raise tool_failed(f"{kind} {name} already exists", kind=kind, name=name)
    if kind == "Deployment":
        await tools_sql.put_deployment(conn, project_id=project_id, name=name, replicas=replicas)
    return {"kind": kind, "name": name, "created": True}


async def k8s_delete_resource(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    kind = _name(v, params, "kind")
    name = _name(v, params, "name")
    v.raise_if_any()
    deleted = await tools_sql.delete_resource(conn, project_id=project_id, kind=kind, name=name)
    if kind == "Deployment":
        await tools_sql.delete_deployment(conn, project_id=project_id, name=name)
    # already gone counts as done: a compensation's goal is the state, not the act
    return {"kind": kind, "name": name, "deleted": bool(deleted)}


async def pg_mutate(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    op = params.get("op")
    table = params.get("table")
    if op not in ("INSERT", "DELETE"):
        v.add("params.op", "required: INSERT or DELETE")
    if not isinstance(table, str) or not TABLE_RE.match(table):
        v.add("params.table", "required: a lower-case SQL identifier")
    if op == "INSERT":
        row = params.get("row")
        if not isinstance(row, dict):
            v.add("params.row", "required for INSERT: an object")
        v.raise_if_any()
        inserted = await tools_sql.insert_row(conn, project_id=project_id, table_name=table, data=row)
        return {"table": table, "inserted_id": str(inserted)}
    row_id = params.get("id")
    try:
        parsed = uuid.UUID(row_id) if isinstance(row_id, str) else None
    except ValueError:
        parsed = None
    if op == "DELETE" and parsed is None:
        v.add("params.id", "required for DELETE: the inserted_id (a UUID)")
    v.raise_if_any()
    deleted = await tools_sql.delete_row(conn, project_id=project_id, table_name=table, row_id=parsed)
    return {"table": table, "id": str(parsed), "deleted": bool(deleted)}


async def knowledge_write(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    entry_id = params.get("entry_id") or str(uuid.uuid4())
    if not isinstance(entry_id, str) or len(entry_id) > 128 or not TOKEN_RE.match(entry_id):
        v.add("params.entry_id", "1-128 printable characters without spaces")
    if "content" not in params:
        v.add("params.content", "required")
    v.raise_if_any()
    created = await tools_sql.write_knowledge(conn, project_id=project_id, entry_id=entry_id, content=params["content"])
    return {"entry_id": entry_id, "created": bool(created)}


async def knowledge_delete(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    v = Violations()
    entry_id = params.get("entry_id")
    if not isinstance(entry_id, str) or not entry_id or len(entry_id) > 128:
        v.add("params.entry_id", "required: 1-128 characters")
    v.raise_if_any()
    deleted = await tools_sql.delete_knowledge(conn, project_id=project_id, entry_id=entry_id)
    return {"entry_id": entry_id, "deleted": bool(deleted)}


async def k8s_exec_pod(conn: Conn, project_id: str, params: dict[str, Any]) -> dict[str, Any]:
    """Irreversible (seed ADR-119 D3): accepted and recorded, nothing can undo it."""
    v = Violations()
    pod = _name(v, params, "pod")
    command = params.get("command")
    if not isinstance(command, str | list) or not command:
        v.add("params.command", "required: a string or a list of strings")
    v.raise_if_any()
    return {"pod": pod, "exit_code": 0, "output": "executed"}


TOOLS: dict[str, Tool] = {
    "k8s_scale_deployment": k8s_scale_deployment,
    "k8s_create_resource": k8s_create_resource,
    "k8s_delete_resource": k8s_delete_resource,
    "pg_mutate": pg_mutate,
    "knowledge_write": knowledge_write,
    "knowledge_delete": knowledge_delete,
    "k8s_exec_pod": k8s_exec_pod,
}
