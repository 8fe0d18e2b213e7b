"""`awooop flow debounce|debounces|undebounce`: a project's debounce rules (docs/flow-control.md#debounce-and-batch).

    awooop flow debounce --project P CHANNEL KEY_EXPR --window S [--max-wait S] [--mode all|last]   (admin)
    awooop flow debounces --project P               list the rules
    awooop flow undebounce --project P CHANNEL      delete a channel's rule (admin)

CHANNEL is telegram, alertmanager, gitea, line or api; KEY_EXPR a dotted path into the event's
input (message.chat.id, groupKey, source.userId, repository.full_name, a field of the API body).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from google.protobuf.duration_pb2 import Duration

from awooop.cli.client import print_json, print_table, run_command, to_json, when
from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client

CHANNELS = ("telegram", "alertmanager", "gitea", "line", "api")
MODES = {"all": scheduler_pb2.DEBOUNCE_MODE_ALL, "last": scheduler_pb2.DEBOUNCE_MODE_LAST}
MODE_NAMES = {v: k for k, v in MODES.items()} | {scheduler_pb2.DEBOUNCE_MODE_UNSPECIFIED: "all"}


def register(f: Any, leaf: Callable[[Any, str, str], argparse.ArgumentParser]) -> None:
    """The three subcommands, under `awooop flow` (f: its subparsers; leaf: how flow makes one)."""
    p = leaf(f, "debounce", "batch a channel's events by a key: one run per quiet window (admin role)")
    p.add_argument("--project", required=True)
    p.add_argument("channel", choices=CHANNELS)
    p.add_argument("key_expression", metavar="KEY_EXPR", help="a dotted path into the event's input: message.chat.id")
    p.add_argument("--window", type=float, required=True, metavar="SECONDS", help="the quiet period that ends a batch")
    p.add_argument(
        "--max-wait", type=float, default=0.0, metavar="SECONDS", help="longest wait after a batch's first event"
    )
    p.add_argument("--mode", choices=sorted(MODES), default="all", help="the run gets every event, or the last")
    p.set_defaults(func=run_command(cmd_debounce))

    p = leaf(f, "debounces", "list a project's debounce rules")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_debounces))

    p = leaf(f, "undebounce", "delete a channel's debounce rule (admin role)")
    p.add_argument("--project", required=True)
    p.add_argument("channel", choices=CHANNELS)
    p.set_defaults(func=run_command(cmd_undebounce))


def _channel(name: str) -> common_pb2.ChannelType.ValueType:
    return common_pb2.ChannelType.Value(f"CHANNEL_TYPE_{name.upper()}")


def _secs(d: Duration) -> str:
    return f"{d.seconds + d.nanos / 1e9:g}s"


def rule_text(r: scheduler_pb2.DebounceRule) -> tuple[str, str, str, str, str]:
    """A rule's (channel, key, window, max wait, mode) as people read them (CLI and console)."""
    channel = common_pb2.ChannelType.Name(r.channel_type).removeprefix("CHANNEL_TYPE_").lower()
    return channel, r.key_expression, _secs(r.window), _secs(r.max_wait), MODE_NAMES[r.mode]


async def cmd_debounce(args: argparse.Namespace, client: Client) -> int:
    rule = scheduler_pb2.DebounceRule(
        project_id=args.project,
        channel_type=_channel(args.channel),
        key_expression=args.key_expression,
        mode=MODES[args.mode],
    )
    rule.window.FromNanoseconds(round(args.window * 1e9))
    if args.max_wait:
        rule.max_wait.FromNanoseconds(round(args.max_wait * 1e9))
    stored = (await client.call(client.scheduler.SetDebounceRule, scheduler_pb2.SetDebounceRuleRequest(rule=rule))).rule
    if args.json:
        print_json(to_json(stored))
    else:
        channel, key, window, max_wait, mode = rule_text(stored)
        print(f"{channel} events of project {stored.project_id} batched by {key}: one run after {window} quiet")
        print(f"(at most {max_wait} after a batch's first event), its input carries {mode} events")
    return 0


async def cmd_debounces(args: argparse.Namespace, client: Client) -> int:
    req = scheduler_pb2.ListDebounceRulesRequest(project_id=args.project)
    rules = (await client.call(client.scheduler.ListDebounceRules, req)).rules
    if args.json:
        print_json({"rules": [to_json(r) for r in rules]})
    else:
        rows = [(*rule_text(r), f"{r.updated_by} at {when(r.updated_at)}") for r in rules]
        print_table(("channel", "key", "window", "max wait", "mode", "set by"), rows)
    return 0


async def cmd_undebounce(args: argparse.Namespace, client: Client) -> int:
    req = scheduler_pb2.DeleteDebounceRuleRequest(project_id=args.project, channel_type=_channel(args.channel))
    deleted = (await client.call(client.scheduler.DeleteDebounceRule, req)).deleted
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"{args.channel} debounce rule: {'deleted' if deleted else 'not found'}")
    return 0
