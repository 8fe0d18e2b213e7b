"""Plans as Postgres runs them: auto_explain logs each statement's plan to the client
(client_min_messages = log), so a test reads the cached plan a connection really used, with the
rows each node read, not an EXPLAIN of a new one."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

import asyncpg


async def explain_to_client(conn: asyncpg.Connection, *, nested: bool = False, buffers: bool = False) -> None:
    """Loads auto_explain on conn: every statement (and with nested, every statement a function
    runs) logs its plan with actual rows (and with buffers, the pages each node read)."""
    await conn.execute("LOAD 'auto_explain'")
    settings = ["log_min_duration = 0", "log_analyze = on", "sample_rate = 1"]
    if nested:
        settings.append("log_nested_statements = on")
    if buffers:
        settings.append("log_buffers = on")
    for setting in settings:
        await conn.execute(f"SET auto_explain.{setting}")


async def logged_plans(conn: asyncpg.Connection, call: Awaitable[Any]) -> list[str]:
    """The plans auto_explain logged while `call` (an awaitable on conn) ran."""
    plans: list[str] = []

    def listen(_: asyncpg.Connection, msg: asyncpg.PostgresLogMessage) -> None:
        if "plan:" in str(msg):
            plans.append(str(msg))

    conn.add_log_listener(listen)
    try:
        await conn.execute("SET client_min_messages = log")
        await call
        await conn.execute("RESET client_min_messages")
    finally:
        conn.remove_log_listener(listen)
    return plans
