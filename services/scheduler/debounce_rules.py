"""Debounce rules per (project, channel) (awooop_debounce_rule; docs/flow-control.md#debounce-and-batch):
the flow RPCs SetDebounceRule, ListDebounceRules and DeleteDebounceRule validate and store them
(debounce_rules.sql); ingest batches the channel's events by them (services/ingest/debounce.py)."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import asyncpg

from services.scheduler import debounce_rules_sql

MAX_SECONDS = 86400.0  # a window or max wait of at most a day
MIN_WINDOW = 0.001
DEFAULT_MAX_WAIT_FACTOR = 10  # max wait unset: ten windows (at most a day)
# the channels a rule may batch: every channel (a schedule's ticks, channel api too, never are)
CHANNELS = ("telegram", "alertmanager", "gitea", "line", "api")


@dataclass(frozen=True, slots=True)
class Rule:
    project_id: str
    channel: str
    key_expression: str
    window: float
    max_wait: float
    mode: str  # "all" | "last"
    updated_by: str | None = None
    updated_at: datetime | None = None


def _rule(r: debounce_rules_sql.SetDebounceRuleRow | debounce_rules_sql.ListDebounceRulesRow) -> Rule:
    return Rule(
        r["project_id"],
        r["channel_type"],
        r["key_expression"],
        r["window_secs"],
        r["max_wait_secs"],
        r["mode"],
        r["updated_by"],
        r["updated_at"],
    )


async def set_rule(pool: asyncpg.Pool, rule: Rule, actor: str) -> Rule:
    row = await debounce_rules_sql.set_debounce_rule(
        pool,
        project_id=rule.project_id,
        channel_type=rule.channel,
        key_expression=rule.key_expression,
        window_secs=rule.window,
        max_wait_secs=rule.max_wait,
        mode=rule.mode,
        actor=actor,
    )
    assert row is not None  # an upsert returns its row
    return _rule(row)


async def list_rules(pool: asyncpg.Pool, project_id: str) -> list[Rule]:
    return [_rule(r) for r in await debounce_rules_sql.list_debounce_rules(pool, project_id=project_id)]


async def delete_rule(pool: asyncpg.Pool, project_id: str, channel: str, actor: str) -> bool:
    row = await debounce_rules_sql.delete_debounce_rule(pool, project_id=project_id, channel_type=channel, actor=actor)
    return bool(row and row["deleted"])
