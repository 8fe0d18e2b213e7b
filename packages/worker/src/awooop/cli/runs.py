"""`awooop runs ...`: the operator's view of runs, through the gRPC API with an API key.

    awooop runs list --project P [--status RUNNING ...] [--limit N] [--build B]
    awooop runs list --parent RUN_ID [--status ...] [--limit N]     a run's children (its project unless --project)
    awooop runs show RUN_ID                 run, state history and journal as one timeline, progress events
    awooop runs watch RUN_ID [--after N] [--tokens [--stream S]]    follow a run's log (state changes, steps,
                                            progress) to its end, and a failed or cancelled run's compensation
                                            to the saga's end; --tokens: its streamed output live too
    awooop runs approve RUN_ID --token T [--reason R]
    awooop runs reject RUN_ID --token T [--reason R]
    awooop runs cancel RUN_ID [--reason R]
    awooop runs unhold RUN_ID [--build B] [--reason R]  a run held because its code did not replay its journal
    awooop runs move RUN_ID --build B [--reason R]      put a run no worker holds on another worker build
    awooop runs waits list RUN_ID           the run's durable waits, open ones first
    awooop runs waits complete RUN_ID [--wait WAIT_ID] [--result JSON]    (approver role)
    awooop runs waits expire RUN_ID [--wait WAIT_ID]                      (approver role)
    awooop runs compensation retry RUN_ID [--step S]
    awooop runs compensation resolve RUN_ID --step S --reason R

Every command takes --json (one JSON object; `watch`: one per line, docs/cli.md); the connection
flags go before or after the action. An RPC error
prints `error: <CODE> <REASON>: message` (plus the field violations) on stderr and exits 1; bad arguments exit 2.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import uuid
from typing import Any

from awooop.cli import timeline
from awooop.cli.client import (
    EXIT_RPC_ERROR,
    EXIT_USAGE,
    add_connection_args,
    positive_int,
    print_json,
    print_table,
    render_error,
    run_command,
    to_json,
    when,
)
from awooop.cli.timeline import (
    channel_name,
    compensation_text,
    saga_name,
    status_name,
    step_status,
    step_type,
    wait_status,
)
from awooop.common.v1 import common_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker.client import Client
from awooop.worker.errors import AwooopError
from awooop.worker.structs import from_struct, to_struct
from awooop.worker.watch import Event, TokenChannel, TokenGap, Tokens, read_events, watch_run

# re-exported: older callers import these names from here
__all__ = ["channel_name", "register", "saga_name", "status_name", "step_status", "step_type"]
STATUSES = [n.removeprefix("RUN_STATUS_") for n in common_pb2.RunStatus.keys() if n != "RUN_STATUS_UNSPECIFIED"]


def register(sub: Any) -> None:
    runs = sub.add_parser("runs", help="list, inspect, approve, cancel runs, end their waits, repair compensations")
    add_connection_args(runs)  # before or after the action: `runs --scheduler X list` = `runs list --scheduler X`
    r = runs.add_subparsers(dest="runs_command", metavar="ACTION", required=True)

    p = _leaf(r, "list", "list a project's runs (or a run's children), newest first")
    p.add_argument("--project", default="", help="the project (required without --parent)")
    p.add_argument(
        "--parent",
        type=_run_id,
        default=None,  # (argparse would check a string default against the type)
        metavar="RUN_ID",
        help="only this run's children (in its project: --project may be left out)",
    )
    p.add_argument(
        "--status",
        action="append",
        type=_status,
        default=[],
        metavar="STATUS",
        help=f"only these statuses (repeat or comma-separate): {', '.join(STATUSES)}",
    )
    p.add_argument("--limit", type=positive_int, default=50, help="at most this many runs (1 or more; default 50)")
    p.add_argument("--build", default="", help="only the runs on this worker build")
    p.set_defaults(func=run_command(cmd_list))

    p = _leaf(r, "show", "one run: fields, state history and journal as a timeline")
    p.add_argument("run_id")
    p.set_defaults(func=run_command(cmd_show))

    p = _leaf(
        r,
        "watch",
        "follow a run: state changes, journal steps and progress events, a failed run's compensation, then its end",
    )
    p.add_argument("run_id")
    p.add_argument("--after", type=int, default=0, metavar="OFFSET", help="start after this offset (default 0)")
    p.add_argument("--tokens", action="store_true", help="print the run's streamed tokens (ctx.stream_token) live")
    p.add_argument("--stream", default="output", help="the token stream to print (default output)")
    p.set_defaults(func=run_command(cmd_watch))

    for name, decision in (("approve", "approve"), ("reject", "reject")):
        p = _leaf(r, name, f"{decision} a run waiting for approval (approver role)")
        p.add_argument("run_id")
        p.add_argument("--token", required=True, help="the approval token the worker received")
        p.add_argument("--reason", default="", help="why (audit log)")
        p.set_defaults(func=run_command(cmd_decide), decision=decision)

    p = _leaf(r, "cancel", "cancel a run (a running one stops at its next heartbeat)")
    p.add_argument("run_id")
    p.add_argument("--reason", default="", help="why (audit log)")
    p.set_defaults(func=run_command(cmd_cancel))

    _register_builds(r)
    _register_waits(r)
    _register_compensation(r)


def _register_builds(r: Any) -> None:
    """The runs' worker builds (docs/versioning.md): unhold a held run, move a run to another build."""
    p = _leaf(r, "unhold", "let a held run be claimed again (after deploying code that replays its journal)")
    p.add_argument("run_id")
    p.add_argument("--build", default="", help="and put it on this worker build")
    p.add_argument("--reason", default="", help="why (audit log)")
    p.set_defaults(func=run_command(cmd_unhold))

    p = _leaf(r, "move", "put a run no worker holds on another worker build (approver or admin role)")
    p.add_argument("run_id")
    p.add_argument("--build", required=True, help="the build it is to resume on")
    p.add_argument("--reason", default="", help="why (audit log)")
    p.set_defaults(func=run_command(cmd_move))


def _register_waits(r: Any) -> None:
    """The `runs waits` commands: list, complete, expire."""
    waits = r.add_parser("waits", help="list a run's durable waits; complete or expire one by hand (approver role)")
    add_connection_args(waits, inherited=True)
    w = waits.add_subparsers(dest="waits_command", metavar="ACTION", required=True)
    p = _leaf(w, "list", "the run's durable waits, open ones first")
    p.add_argument("run_id")
    p.set_defaults(func=run_command(cmd_waits_list))
    p = _leaf(w, "complete", "complete the run's open wait with a result; a run parked on it resumes")
    p.add_argument("run_id")
    p.add_argument("--wait", default="", metavar="WAIT_ID", help="which wait (default: the run's only open wait)")
    p.add_argument("--result", type=_json_object, default={}, metavar="JSON", help="a JSON object (default {})")
    p.set_defaults(func=run_command(cmd_waits_end), end="complete")
    p = _leaf(w, "expire", "end the run's open wait as timed out now; a run parked on it resumes and sees the timeout")
    p.add_argument("run_id")
    p.add_argument("--wait", default="", metavar="WAIT_ID", help="which wait (default: the run's only open wait)")
    p.set_defaults(func=run_command(cmd_waits_end), end="expire")


def _register_compensation(r: Any) -> None:
    """The `runs compensation` commands: retry, resolve."""
    comp = r.add_parser("compensation", help="retry or resolve a failed compensation (admin role)")
    add_connection_args(comp, inherited=True)
    c = comp.add_subparsers(dest="compensation_command", metavar="ACTION", required=True)
    p = _leaf(c, "retry", "run the failed compensations of a run again")
    p.add_argument("run_id")
    p.add_argument("--step", default="", help="only this step (default: every compensation_failed step)")
    p.add_argument(
        "--wait",
        type=float,
        default=RETRY_WAIT,
        metavar="SECONDS",
        help=f"wait this long for the retry's outcome; exit 1 if it failed again (default {RETRY_WAIT:g}; 0: no wait)",
    )
    p.set_defaults(func=run_command(cmd_retry))
    p = _leaf(c, "resolve", "mark a failed compensation as resolved by hand")
    p.add_argument("run_id")
    p.add_argument("--step", required=True)
    p.add_argument("--reason", required=True, help="why it is safe to consider it resolved (audit log)")
    p.set_defaults(func=run_command(cmd_resolve))


def _leaf(sub: Any, name: str, help_text: str) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(name, help=help_text, description=help_text)
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    add_connection_args(p, inherited=True)
    return p


def _run_id(value: str) -> str:
    try:
        return str(uuid.UUID(value))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a run id (a UUID): {value!r}") from None


def _status(value: str) -> list[common_pb2.RunStatus.ValueType]:
    out = []
    for part in value.split(","):
        name = part.strip().upper().removeprefix("RUN_STATUS_")
        if name not in STATUSES:
            raise argparse.ArgumentTypeError(f"unknown status {part!r}; one of {', '.join(STATUSES)}")
        out.append(common_pb2.RunStatus.Value(f"RUN_STATUS_{name}"))
    return out


# --- list ---


async def cmd_list(args: argparse.Namespace, client: Client) -> int:
    statuses = [s for group in args.status for s in group]
    project = args.project
    if not project and not args.parent:
        print("error: --project or --parent is required", file=sys.stderr)
        return EXIT_USAGE
    if not project:  # a run's children are in its project
        parent = await client.call(client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=args.parent))
        project = parent.run.project_id
    runs: list[common_pb2.Run] = []
    token = ""
    while len(runs) < args.limit:
        resp = await client.call(
            client.scheduler.ListRuns,
            scheduler_pb2.ListRunsRequest(
                project_id=project,
                statuses=statuses,
                page_size=min(500, max(1, args.limit - len(runs))),
                page_token=token,
                parent_run_id=args.parent or "",
                build_id=args.build,
            ),
        )
        runs.extend(resp.runs)
        token = resp.next_page_token
        if not token:
            break
    runs = runs[: args.limit]
    if args.json:
        print_json({"runs": [to_json(r) for r in runs], "next_page_token": token})
        return 0
    if not runs:
        where = f"run {args.parent} has no children" if args.parent else f"no runs in project {project}"
        print(where + (" with that status" if statuses else ""))
        return 0
    step = ["STEP"] if args.parent else []  # the children's step ids in their parent
    print_table(
        ["RUN_ID", *step, "STATUS", "ATTEMPTS", "CHANNEL", "SAGA", "WORKER", "CREATED", "UPDATED", "REASON"],
        [
            [
                r.run_id,
                *([r.parent_step_id] if args.parent else []),
                status_name(r.status) + (" (cancel requested)" if r.cancel_requested else ""),
                timeline.attempts_text(r, "/"),
                channel_name(r.channel_type),
                saga_name(r.saga_status),
                r.worker_id or "-",
                when(r.created_at),
                when(r.updated_at),
                _short(r.failure_reason, 40),
            ]
            for r in runs
        ],
    )
    if token:
        print(f"(more: raise --limit; next page token {token})")
    return 0


# --- show ---


async def cmd_show(args: argparse.Namespace, client: Client) -> int:
    got = await client.call(client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=args.run_id))
    run = got.run
    problems: list[str] = []
    history: list[scheduler_pb2.RunEvent] = []
    journal: saga_pb2.GetJournalResponse | None = None
    progress: list[Event] = []
    try:
        progress = [e for e in await read_events(client, args.run_id) if e.source == "progress"]
    except AwooopError as err:
        problems.append("progress events: " + render_error(err))
    try:
        history = list(
            (
                await client.call(
                    client.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=args.run_id)
                )
            ).events
        )
    except AwooopError as err:
        problems.append("history: " + render_error(err))
    try:
        journal = await client.call(client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=args.run_id))
    except AwooopError as err:
        problems.append("journal: " + render_error(err))
    if args.json:
        out: dict[str, Any] = {
            "run": to_json(run),
            "children": [to_json(c) for c in got.children],
            "history": [to_json(e) for e in history],
        }
        out["progress"] = [_event_json(e) for e in progress]
        if journal is not None:
            out["journal"] = to_json(journal)
            out["journal"]["saga_steps"] = json.loads(journal.saga_steps_json or "[]")
            out["journal"].pop("saga_steps_json", None)
        print_json(out)
    else:
        _print_run(run, got.waiting_for_build)
        _print_children(list(got.children))
        _print_timeline(history, journal)
        if journal is not None:
            _print_journal(journal)
        _print_progress(progress)
    for p in problems:
        print(p, file=sys.stderr)
    return EXIT_RPC_ERROR if problems else 0


def _event_json(e: Event) -> dict[str, Any]:
    return {
        "offset": e.offset,
        "source": e.source,
        "kind": e.kind,
        "data": e.data,
        "attempt": e.attempt,
        "at": e.at.isoformat().replace("+00:00", "Z"),
    }


def _at(e: Event) -> str:
    return str(e.at.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z")


def _event_text(e: Event) -> str:
    at = _at(e)[11:]
    if e.source == "state":
        change = f" {e.data.get('from_status', '')}->{e.data.get('to_status', '')}" if e.data.get("to_status") else ""
        return f"{e.offset:>5}  {at}  state     {e.kind}{change}  by {e.data.get('actor', '')}"
    if e.source == "step":
        return f"{e.offset:>5}  {at}  step      {e.data.get('step_id', '')} {e.kind} (attempt {e.attempt})"
    return f"{e.offset:>5}  {at}  progress  {e.kind or '-'}  {_short(_j(e.data), 120)}"


def _print_progress(progress: list[Event]) -> None:
    print()
    print(f"progress events ({len(progress)})")
    if not progress:
        print("  (none emitted)")
    rows = [[e.offset, _at(e), e.attempt, e.kind or "-", _short(_j(e.data), 100)] for e in progress]
    if rows:
        print_table(["OFFSET", "AT", "ATTEMPT", "KIND", "DATA"], rows)


# --- watch ---


async def cmd_watch(args: argparse.Namespace, client: Client) -> int:
    """Follows the run, and a failed or cancelled run's compensation, to their end: the saga's
    state changes and steps come after the run's own. With --tokens, the run's streamed tokens
    are printed as they come (a checkpoint row's, already printed, is not repeated)."""
    out = _TokenPrinter(args.json)
    items = watch_run(
        client, args.run_id, after=args.after, until_saga_ends=True, tokens=args.tokens, token_stream=args.stream
    )
    async for item in items:
        if isinstance(item, Tokens | TokenGap | TokenChannel):
            out.token_item(item)
            continue
        if isinstance(item, Event):
            if args.tokens and item.kind == "stream_checkpoint" and not args.json:
                continue
            out.line(json.dumps({"event": _event_json(item)}) if args.json else _event_text(item))
            continue
        if args.json:
            out.line(json.dumps({"run": to_json(item)}))
        else:
            out.line(f"ended  {status_name(item.status)}  (saga {saga_name(item.saga_status)})")
            if item.HasField("output"):
                print(f"output {_j(from_struct(item.output))}")
            elif item.failure_reason:
                print(f"reason {item.failure_reason}")
    return 0


class _TokenPrinter:
    """`runs watch --tokens`: tokens written as they come, other lines after a line break."""

    def __init__(self, as_json: bool) -> None:
        self.as_json = as_json
        self.mid_line = False
        self.attempt = 0

    def line(self, text: str) -> None:
        if self.mid_line:
            print()
            self.mid_line = False
        print(text, flush=True)

    def token_item(self, item: Tokens | TokenGap | TokenChannel) -> None:
        if self.as_json:
            key = {Tokens: "tokens", TokenGap: "token_gap", TokenChannel: "token_channel"}[type(item)]
            data = dict(item.__dict__)
            if isinstance(item, Tokens):
                data["produced_at"] = item.produced_at.isoformat().replace("+00:00", "Z") if item.produced_at else None
            print(json.dumps({key: data}), flush=True)
        elif isinstance(item, Tokens):
            if item.attempt != self.attempt:
                if self.attempt:
                    self.line(f"[attempt {item.attempt} streams again]")
                self.attempt = item.attempt
            sys.stdout.write(item.text)
            sys.stdout.flush()
            self.mid_line = True
        elif isinstance(item, TokenGap):
            self.line(
                f"[tokens {item.from_seq}..{item.to_seq} of attempt {item.attempt} missed live ({item.reason}); "
                "they are in the run's stream_checkpoint events]"
            )
        else:
            self.line(f"[{item.message}]")


def _print_run(run: common_pb2.Run, waiting_for_build: bool = False) -> None:
    rows = [("run", run.run_id), *timeline.run_fields(run, waiting_for_build=waiting_for_build)]
    rows.append(("input", _short(_j(from_struct(run.input)), 160)))
    if run.HasField("output"):
        rows.append(("output", _short(_j(from_struct(run.output)), 160)))
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k.ljust(width)}  {v}")


def _print_children(children: list[scheduler_pb2.ChildRunRef]) -> None:
    """The run's children (the run tree; `awooop runs show <child>` goes down, `parent` up)."""
    if not children:
        return
    print()
    print(f"children ({len(children)}, in start order)")
    width = max(len(c.step_id) for c in children)
    for c in children:
        print(f"  {c.step_id.ljust(width)}  {c.run_id}  {status_name(c.status)}")


def _print_timeline(history: list[scheduler_pb2.RunEvent], journal: saga_pb2.GetJournalResponse | None) -> None:
    stamps = [(when(e.at), e.text()) for e in timeline.build(history, journal)]
    days = {w[:10] for w, _ in stamps}
    print()
    print(f"timeline (UTC{', ' + days.pop() if len(days) == 1 else ''})")
    if not stamps:
        print("  (nothing recorded)")
    for w, text in stamps:
        print(f"  {w[11:] if not days else w}  {text}")


def _print_journal(journal: saga_pb2.GetJournalResponse) -> None:
    print()
    print(f"journal (saga {saga_name(journal.saga_status)})")
    if not journal.steps:
        print("  (no steps)")
        return
    rows: list[list[Any]] = []
    for s in journal.steps:
        comp = compensation_text(s)
        rows.append(
            [
                s.seq,
                s.step_id,
                step_type(s.step_type),
                step_status(s.status),
                s.attempt,
                s.tool_id or "-",
                _short(_j(from_struct(s.tool_params)), 40) if s.tool_id else "-",
                _short(_j(from_struct(s.result)), 50) if s.HasField("result") else "-",
                comp or "-",
            ]
        )
        if s.resolved_by:
            rows[-1][-1] += f" (resolved by {s.resolved_by}: {_short(s.resolution_reason, 40)})"
    print_table(["SEQ", "STEP", "TYPE", "STATUS", "ATTEMPT", "TOOL", "PARAMS", "RESULT", "COMPENSATION"], rows)


# --- approve / reject / cancel ---


async def cmd_decide(args: argparse.Namespace, client: Client) -> int:
    decision = scheduler_pb2.DECISION_APPROVE if args.decision == "approve" else scheduler_pb2.DECISION_REJECT
    resp = await client.call(
        client.scheduler.DecideApproval,
        scheduler_pb2.DecideApprovalRequest(
            run_id=args.run_id, approval_token=args.token, decision=decision, reason=args.reason
        ),
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    verb = "approved" if args.decision == "approve" else "rejected"
    line = f"run {resp.run.run_id} {verb}: now {status_name(resp.run.status)}"
    if resp.compensation_requested:
        line += "; compensation requested (see `awooop runs show`)"
    print(line)
    return 0


async def cmd_cancel(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=args.run_id, reason=args.reason)
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    run = resp.run
    if run.status == common_pb2.RUN_STATUS_CANCELLED:
        line = f"run {run.run_id} cancelled"
    else:
        line = (
            f"run {run.run_id} is {status_name(run.status)}: cancel requested; its worker stops at the next heartbeat"
        )
    if resp.compensation_requested:
        line += "; compensation requested"
    print(line)
    return 0


async def cmd_unhold(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.scheduler.UnholdRun,
        scheduler_pb2.UnholdRunRequest(run_id=args.run_id, reason=args.reason, build_id=args.build),
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    on = f" on build {resp.run.build_id}" if resp.run.build_id else ""
    print(f"run {resp.run.run_id} unheld: {status_name(resp.run.status)}, claimable now{on}")
    return 0


async def cmd_move(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.scheduler.SetRunBuild,
        scheduler_pb2.SetRunBuildRequest(run_id=args.run_id, build_id=args.build, reason=args.reason),
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    print(f"run {resp.run.run_id} is on build {resp.run.build_id} ({status_name(resp.run.status)})")
    return 0


# --- durable waits ---


def _json_object(value: str) -> dict[str, Any]:
    try:
        parsed = json.loads(value)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON: {err}") from None
    if not isinstance(parsed, dict):
        raise argparse.ArgumentTypeError("a JSON object ({...}) is required")
    return parsed


WAIT_KINDS = {v: n.removeprefix("WAIT_KIND_").lower() for n, v in scheduler_pb2.WaitKind.items()}


async def _waits(client: Client, run_id: str) -> list[scheduler_pb2.Wait]:
    resp = await client.call(client.scheduler.ListWaits, scheduler_pb2.ListWaitsRequest(run_id=run_id))
    return list(resp.waits)


async def cmd_waits_list(args: argparse.Namespace, client: Client) -> int:
    found = await _waits(client, args.run_id)
    if args.json:
        print_json({"waits": [to_json(x) for x in found]})
        return 0
    if not found:
        print(f"run {args.run_id} has no durable waits")
        return 0
    rows = [
        [
            x.wait_id,
            x.step_id,
            WAIT_KINDS.get(x.kind, "?"),
            wait_status(x),
            when(x.expires_at),
            when(x.completed_at) or "-",
            x.completed_by or "-",
        ]
        for x in found
    ]
    print_table(["WAIT", "STEP", "KIND", "STATUS", "EXPIRES", "ENDED", "BY"], rows)
    return 0


async def cmd_waits_end(args: argparse.Namespace, client: Client) -> int:
    """complete / expire: the wait named by --wait, or the run's one open wait."""
    wait_id = args.wait
    if not wait_id:
        open_ = [x for x in await _waits(client, args.run_id) if x.status == scheduler_pb2.WAIT_STATUS_OPEN]
        if len(open_) != 1:
            listed = ", ".join(f"{x.wait_id} ({x.step_id})" for x in open_)
            say = f"{len(open_)} open waits: {listed}; name one with --wait" if open_ else "no open wait"
            print(f"error: run {args.run_id} has {say}", file=sys.stderr)
            return EXIT_RPC_ERROR
        wait_id = open_[0].wait_id
    resp: scheduler_pb2.CompleteWaitResponse | scheduler_pb2.ExpireWaitResponse
    if args.end == "complete":
        request = scheduler_pb2.CompleteWaitRequest(wait_id=wait_id, result=to_struct(args.result))
        resp = await client.call(client.scheduler.CompleteWait, request)
    else:
        resp = await client.call(client.scheduler.ExpireWait, scheduler_pb2.ExpireWaitRequest(wait_id=wait_id))
    if args.json:
        print_json(to_json(resp))
        return 0
    verb = "completed" if args.end == "complete" else "expired (timed out)"
    then = "; its run resumes (PENDING)" if resp.resumed else "; its run was not parked on it"
    print(f"wait {resp.wait.wait_id} ({resp.wait.step_id}) of run {resp.wait.run_id} {verb}{then}")
    return 0


# --- compensation ---


RETRY_WAIT = 30.0  # seconds `compensation retry` waits for the saga service's outcome
RETRY_POLL = 0.5
EXIT_STILL_FAILING = 1


async def cmd_retry(args: argparse.Namespace, client: Client) -> int:
    """Schedules the retry, then (unless --wait 0) follows the journal until the saga leaves
    COMPENSATING: the retry runs in the saga service, so its answer alone says nothing of the outcome."""
    resp = await client.call(
        client.saga.RetryCompensation, saga_pb2.RetryCompensationRequest(run_id=args.run_id, step_id=args.step)
    )
    saga_status, failed = resp.saga_status, []
    deadline = asyncio.get_running_loop().time() + max(0.0, args.wait)
    while args.wait > 0 and saga_status == common_pb2.SAGA_STATUS_COMPENSATING:
        if asyncio.get_running_loop().time() >= deadline:
            break
        await asyncio.sleep(RETRY_POLL)
        journal = await client.call(client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=args.run_id))
        saga_status = journal.saga_status
        failed = [s for s in journal.steps if s.status == common_pb2.STEP_STATUS_COMPENSATION_FAILED]
    code = EXIT_STILL_FAILING if saga_status == common_pb2.SAGA_STATUS_COMPENSATION_FAILED else 0
    if args.json:
        print_json(to_json(resp) | {"saga_status": common_pb2.SagaStatus.Name(saga_status)})
        return code
    what = f"step {args.step}" if args.step else "every failed compensation"
    if args.wait <= 0:
        print(f"run {args.run_id}: retrying {what}; saga {saga_name(saga_status)} (not waited for)")
    elif saga_status == common_pb2.SAGA_STATUS_COMPENSATING:
        print(f"run {args.run_id}: retrying {what}; still compensating after {args.wait:g} s (see `awooop runs show`)")
    elif code:
        print(f"run {args.run_id}: retried {what}; it failed again: saga {saga_name(saga_status)}", file=sys.stderr)
        for s in failed:
            print(f"  step {s.step_id}: {s.error or 'compensation failed'}", file=sys.stderr)
    else:
        print(f"run {args.run_id}: retried {what}; saga {saga_name(saga_status)}")
    return code


async def cmd_resolve(args: argparse.Namespace, client: Client) -> int:
    resp = await client.call(
        client.saga.ResolveCompensation,
        saga_pb2.ResolveCompensationRequest(run_id=args.run_id, step_id=args.step, reason=args.reason),
    )
    if args.json:
        print_json(to_json(resp))
        return 0
    step = f"step {resp.step.step_id} {step_status(resp.step.status)}"
    print(f"run {args.run_id}: {step}; saga {saga_name(resp.saga_status)}")
    return 0


_j = timeline.dumps
_short = timeline.short
