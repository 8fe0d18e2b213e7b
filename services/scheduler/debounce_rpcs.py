"""The debounce rule RPCs (SetDebounceRule, ListDebounceRules, DeleteDebounceRule): validate,
check the caller's role, call debounce_rules, build the answer."""

from __future__ import annotations

import asyncpg
from google.protobuf.duration_pb2 import Duration

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from services.common import debounce_key
from services.common.access import require_member, require_role
from services.common.auth import current_principal
from services.common.runs import channel_from_pb, channel_to_pb, set_time
from services.common.validate import Violations
from services.scheduler import debounce_rules
from services.scheduler.debounce_rules import MAX_SECONDS, MIN_WINDOW

MODE_PB = {"all": scheduler_pb2.DEBOUNCE_MODE_ALL, "last": scheduler_pb2.DEBOUNCE_MODE_LAST}
MODE_OF_PB = {v: k for k, v in MODE_PB.items()} | {scheduler_pb2.DEBOUNCE_MODE_UNSPECIFIED: "all"}


def _duration(secs: float) -> Duration:
    return Duration(seconds=int(secs), nanos=round((secs - int(secs)) * 1e9))


def rule_pb(rule: debounce_rules.Rule) -> scheduler_pb2.DebounceRule:
    pb = scheduler_pb2.DebounceRule(
        project_id=rule.project_id,
        channel_type=channel_to_pb(rule.channel),
        key_expression=rule.key_expression,
        window=_duration(rule.window),
        max_wait=_duration(rule.max_wait),
        mode=MODE_PB[rule.mode],
        updated_by=rule.updated_by or "",
    )
    if rule.updated_at is not None:
        set_time(pb.updated_at, rule.updated_at)
    return pb


def _channel(v: Violations, field: str, value: int) -> str:
    """A channel a rule may batch (debounce_rules.CHANNELS), or "" with a violation."""
    if value not in common_pb2.ChannelType.values() or value == common_pb2.CHANNEL_TYPE_UNSPECIFIED:
        v.enum(field, value, common_pb2.ChannelType)
        return ""
    name = channel_from_pb(value)
    if name not in debounce_rules.CHANNELS:
        v.add(field, f"{name} events are not debounced; one of {', '.join(debounce_rules.CHANNELS)}")
        return ""
    return name


def parse_rule(pb: scheduler_pb2.DebounceRule) -> debounce_rules.Rule:
    """A SetDebounceRule's rule, every bad field named under `rule.` in one INVALID_ARGUMENT."""
    v = Violations()
    project_id = v.project_id("rule.project_id", pb.project_id)
    channel = _channel(v, "rule.channel_type", pb.channel_type)
    if debounce_key.parse(pb.key_expression) is None:
        v.add("rule.key_expression", debounce_key.SYNTAX)
    window = pb.window.seconds + pb.window.nanos / 1e9
    if not v.check(MIN_WINDOW <= window <= MAX_SECONDS, "rule.window", "the quiet period: 1 ms to 1 day"):
        window = MIN_WINDOW
    max_wait = pb.max_wait.seconds + pb.max_wait.nanos / 1e9
    if not pb.HasField("max_wait"):
        max_wait = min(MAX_SECONDS, window * debounce_rules.DEFAULT_MAX_WAIT_FACTOR)
    v.check(window <= max_wait <= MAX_SECONDS, "rule.max_wait", "at least the window, at most 1 day")
    if pb.mode not in MODE_OF_PB:
        v.enum("rule.mode", pb.mode, scheduler_pb2.DebounceMode)
    v.raise_if_any()
    return debounce_rules.Rule(project_id, channel, pb.key_expression, window, max_wait, MODE_OF_PB[pb.mode])


class DebounceRpcs:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    async def set_rule(self, request: scheduler_pb2.SetDebounceRuleRequest) -> scheduler_pb2.SetDebounceRuleResponse:
        rule = parse_rule(request.rule)
        principal = current_principal()
        require_role(principal, rule.project_id, "admin")
        stored = await debounce_rules.set_rule(self.pool, rule, principal.actor)
        return scheduler_pb2.SetDebounceRuleResponse(rule=rule_pb(stored))

    async def list_rules(
        self, request: scheduler_pb2.ListDebounceRulesRequest
    ) -> scheduler_pb2.ListDebounceRulesResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        v.raise_if_any()
        require_member(current_principal(), project_id)
        rules = await debounce_rules.list_rules(self.pool, project_id)
        return scheduler_pb2.ListDebounceRulesResponse(rules=[rule_pb(r) for r in rules])

    async def delete_rule(
        self, request: scheduler_pb2.DeleteDebounceRuleRequest
    ) -> scheduler_pb2.DeleteDebounceRuleResponse:
        v = Violations()
        project_id = v.project_id("project_id", request.project_id)
        channel = _channel(v, "channel_type", request.channel_type)
        v.raise_if_any()
        principal = current_principal()
        require_role(principal, project_id, "admin")
        deleted = await debounce_rules.delete_rule(self.pool, project_id, channel, principal.actor)
        return scheduler_pb2.DeleteDebounceRuleResponse(deleted=deleted)
