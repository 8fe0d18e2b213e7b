"""`awooop flow ...`: a project's flow control, through the gRPC API with an API key.

    awooop flow show --project P                     retry policy (own and effective), weight, limits
    awooop flow set --project P [--initial-backoff S] [--multiplier M] [--max-backoff S] [--jitter J]
                    [--max-attempts N] [--non-retryable CODE ...] [--weight W]   (admin; replaces the settings)
                    [--versioning pinned|auto-upgrade] [--sticky-resume SECONDS]  (unset: kept)
    awooop flow limit --project P KEY N [--starts M --per S]   key limits: N running, M starts per S s (admin)
    awooop flow schedule --project P NAME CRON [--tz ZONE] [--input JSON]   one run per tick (admin)
    awooop flow schedules --project P                 list schedules
    awooop flow unschedule --project P NAME           delete a schedule (admin)
    awooop flow debounce|debounces|undebounce ...     debounce rules (awooop.cli.debounce)

Every command takes --json; errors as `awooop runs`.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from google.protobuf.duration_pb2 import Duration
from google.protobuf.struct_pb2 import Struct

from awooop.cli import debounce
from awooop.cli.client import add_connection_args, print_json, print_table, run_command, to_json, when
from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client


def register(sub: Any) -> None:
    flow = sub.add_parser("flow", help="a project's retry policy, claim weight and concurrency limits")
    f = flow.add_subparsers(dest="flow_command", metavar="ACTION", required=True)

    p = _leaf(f, "show", "a project's retry policy (its own and the effective one), weight and limits")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_show))

    p = _leaf(f, "set", "set a project's retry policy and weight (admin role; unset values: the service's)")
    p.add_argument("--project", required=True)
    p.add_argument("--initial-backoff", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--multiplier", type=float, default=0.0)
    p.add_argument("--max-backoff", type=float, default=0.0, metavar="SECONDS")
    p.add_argument("--jitter", type=float, default=0.0, help="0-1")
    p.add_argument("--max-attempts", type=int, default=0)
    p.add_argument("--non-retryable", action="append", default=[], metavar="CODE", help="repeatable")
    p.add_argument("--weight", type=int, default=0, help="share of multi-project claims (1-1000)")
    p.add_argument(
        "--versioning",
        choices=sorted(VERSIONING),
        default=None,
        help="how runs with journaled steps resume across worker builds (unset: kept; docs/versioning.md)",
    )
    p.add_argument(
        "--sticky-resume",
        type=int,
        default=None,
        metavar="SECONDS",
        help="a run resumed after a wait or an approval waits this long for the worker that held it"
        " (0: off; unset: kept; docs/flow-control.md)",
    )
    p.set_defaults(func=run_command(cmd_set))

    p = _leaf(f, "limit", "set a concurrency key's limit in a project (0 removes it; admin role)")
    p.add_argument("--project", required=True)
    p.add_argument("limit_key", metavar="KEY", help="the concurrency key, e.g. llm:provider-x")
    p.add_argument("max_running", type=int, metavar="N", help="most running at once (0: no concurrency limit)")
    p.add_argument("--starts", type=int, default=0, help="rate: at most this many starts per --per")
    p.add_argument("--per", type=float, default=0.0, metavar="SECONDS", help="the rate's period")
    p.set_defaults(func=run_command(cmd_limit))

    p = _leaf(f, "schedule", "create or replace a cron schedule: one run per tick (admin role)")
    p.add_argument("--project", required=True)
    p.add_argument("name")
    p.add_argument("cron", help="5 fields (or 6 with seconds first), e.g. '0 6 * * *'")
    p.add_argument("--tz", default="UTC", help="IANA time zone the expression is read in (default UTC)")
    p.add_argument("--input", default="{}", help="the runs' input as a JSON object")
    p.set_defaults(func=run_command(cmd_schedule))

    p = _leaf(f, "schedules", "list a project's schedules")
    p.add_argument("--project", required=True)
    p.set_defaults(func=run_command(cmd_schedules))

    p = _leaf(f, "unschedule", "delete a schedule (admin role)")
    p.add_argument("--project", required=True)
    p.add_argument("name")
    p.set_defaults(func=run_command(cmd_unschedule))
    debounce.register(f, _leaf)


# --versioning's words -> Versioning, and back
VERSIONING = {"pinned": common_pb2.VERSIONING_PINNED, "auto-upgrade": common_pb2.VERSIONING_AUTO_UPGRADE}
VERSIONING_NAMES = {v: k for k, v in VERSIONING.items()} | {common_pb2.VERSIONING_UNSPECIFIED: "pinned"}


def _leaf(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_connection_args(p)
    return p


def _duration(seconds: float) -> Duration | None:
    if not seconds:
        return None
    d = Duration()
    d.FromNanoseconds(round(seconds * 1e9))
    return d


def _secs(d: Duration) -> str:
    return f"{d.seconds + d.nanos / 1e9:g}s"


def _rate(limit: scheduler_pb2.ConcurrencyLimit) -> str:
    return f"{limit.max_starts}/{_secs(limit.per)}" if limit.max_starts else "-"


def _policy_text(p: common_pb2.RetryPolicy) -> str:
    parts = []
    if p.HasField("initial_backoff"):
        parts.append(f"initial {_secs(p.initial_backoff)}")
    if p.multiplier:
        parts.append(f"x{p.multiplier:g}")
    if p.HasField("max_backoff"):
        parts.append(f"max {_secs(p.max_backoff)}")
    if p.jitter:
        parts.append(f"jitter {p.jitter:g}")
    if p.max_attempts:
        parts.append(f"{p.max_attempts} attempts")
    if p.non_retryable_error_codes:
        parts.append("never retried: " + ",".join(p.non_retryable_error_codes))
    return ", ".join(parts) or "-"


async def cmd_show(args: argparse.Namespace, client: Client) -> int:
    flow = (
        await client.call(client.scheduler.GetProjectFlow, scheduler_pb2.GetProjectFlowRequest(project_id=args.project))
    ).flow
    limits = (
        await client.call(
            client.scheduler.ListConcurrencyLimits,
            scheduler_pb2.ListConcurrencyLimitsRequest(project_id=args.project),
        )
    ).limits
    if args.json:
        print_json({"flow": to_json(flow), "limits": [to_json(x) for x in limits]})
        return 0
    print(f"project          {flow.project_id}")
    print(f"weight           {flow.weight}")
    print(f"retry policy     {_policy_text(flow.retry_policy)}")
    print(f"effective        {_policy_text(flow.effective_retry_policy)}")
    print(f"versioning       {VERSIONING_NAMES[flow.versioning]}")
    print(f"sticky resume    {_sticky_text(flow)}")
    if limits:
        print()
        rows = [(x.key, x.max_running or "-", _rate(x), x.running, x.waiting) for x in limits]
        print_table(("key", "limit", "rate", "running", "waiting"), rows)
    return 0


async def cmd_set(args: argparse.Namespace, client: Client) -> int:
    policy = common_pb2.RetryPolicy(
        initial_backoff=_duration(args.initial_backoff),
        multiplier=args.multiplier,
        max_backoff=_duration(args.max_backoff),
        jitter=args.jitter,
        max_attempts=args.max_attempts,
        non_retryable_error_codes=args.non_retryable,
    )
    req = scheduler_pb2.SetProjectFlowRequest(
        project_id=args.project,
        retry_policy=policy,
        weight=args.weight,
        versioning=VERSIONING.get(args.versioning or "", common_pb2.VERSIONING_UNSPECIFIED),
        sticky_resume_seconds=args.sticky_resume,
    )
    flow = (await client.call(client.scheduler.SetProjectFlow, req)).flow
    if args.json:
        print_json(to_json(flow))
    else:
        text = _policy_text(flow.effective_retry_policy)
        print(
            f"project {flow.project_id}: weight {flow.weight}, retry policy {text},"
            f" versioning {VERSIONING_NAMES[flow.versioning]}, sticky resume {_sticky_text(flow)}"
        )
    return 0


def _sticky_text(flow: scheduler_pb2.ProjectFlow) -> str:
    if not flow.sticky_resume_seconds:
        return "off"
    return f"{flow.sticky_resume_seconds} s (a resumed run waits that long for the worker that held it)"


async def cmd_limit(args: argparse.Namespace, client: Client) -> int:
    req = scheduler_pb2.SetConcurrencyLimitRequest(
        project_id=args.project,
        key=args.limit_key,
        max_running=args.max_running,
        max_starts=args.starts,
        per=_duration(args.per),
    )
    limit = (await client.call(client.scheduler.SetConcurrencyLimit, req)).limit
    if args.json:
        print_json(to_json(limit))
    else:
        parts = []
        if limit.max_running:
            parts.append(f"at most {limit.max_running} running ({limit.running} now)")
        if limit.max_starts:
            parts.append(f"at most {limit.max_starts} starts per {_secs(limit.per)}")
        print(f"{limit.key}: {', '.join(parts) or 'no limit'}")
    return 0


def _input(text: str) -> Struct:
    try:
        data = json.loads(text)
    except ValueError as exc:
        raise SystemExit(f"--input: not JSON ({exc})") from None
    if not isinstance(data, dict):
        raise SystemExit("--input: must be a JSON object")
    st = Struct()
    st.update(data)
    return st


async def cmd_schedule(args: argparse.Namespace, client: Client) -> int:
    sched = scheduler_pb2.Schedule(
        project_id=args.project, name=args.name, cron=args.cron, time_zone=args.tz, input=_input(args.input)
    )
    req = scheduler_pb2.SetScheduleRequest(schedule=sched)
    stored = (await client.call(client.scheduler.SetSchedule, req)).schedule
    if args.json:
        print_json(to_json(stored))
    else:
        print(f"schedule {stored.name}: '{stored.cron}' ({stored.time_zone}), next tick {when(stored.next_tick)}")
    return 0


async def cmd_schedules(args: argparse.Namespace, client: Client) -> int:
    req = scheduler_pb2.ListSchedulesRequest(project_id=args.project)
    found = (await client.call(client.scheduler.ListSchedules, req)).schedules
    if args.json:
        print_json({"schedules": [to_json(s) for s in found]})
    else:
        rows = [(s.name, s.cron, s.time_zone, next_tick_text(s), error_text(s)) for s in found]
        print_table(("name", "cron", "time zone", "next tick", "error"), rows)
    return 0


def next_tick_text(s: scheduler_pb2.Schedule) -> str:
    """A schedule's next tick as people read it (the CLI's table and the console's page)."""
    return "none left" if s.next_tick.ToDatetime().year == 9999 else when(s.next_tick)


def error_text(s: scheduler_pb2.Schedule) -> str:
    """Why the last tick failed or none is left, with when; "-" when the last tick fired."""
    return f"{s.last_error} (at {when(s.last_error_at)})" if s.last_error else "-"


async def cmd_unschedule(args: argparse.Namespace, client: Client) -> int:
    req = scheduler_pb2.DeleteScheduleRequest(project_id=args.project, name=args.name)
    deleted = (await client.call(client.scheduler.DeleteSchedule, req)).deleted
    if args.json:
        print_json({"deleted": deleted})
    else:
        print(f"schedule {args.name}: {'deleted' if deleted else 'not found'}")
    return 0
