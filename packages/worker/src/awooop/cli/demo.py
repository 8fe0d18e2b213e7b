"""`awooop demo`: the seeds' story end to end, against a running `awooop up`.

1. the reference gateway gets a deployment (api, 1 replica) in a fresh project
2. a Telegram update is delivered three times -> one run (E-IDEMPOTENT-001 for the repeats)
3. worker A (a real process) claims it, journals "diagnose" and "scale" (api -> 3 through the gateway)
4. worker A is killed with SIGKILL before it finishes
5. worker B starts; the reaper returns the expired lease's run to PENDING; B claims it
6. B's journal replay skips both steps (no second scale) and asks for approval
7. the approver rejects -> FAILED; the saga compensates: api back to 1 replica
8. the journal and the gateway's answer are shown

The workers claim with a short lease (--lease-ttl, default 2 s), so the run is reapable two
seconds after the crash; how soon it comes back then depends on the scheduler's reaper interval
(AWOOOP_REAPER_INTERVAL: `awooop up` uses 2 s, a served scheduler 60 s by default).

--json prints a machine-readable summary on stdout (the story goes to stderr).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc

from awooop.cli.client import add_connection_args, print_json, run_command, when
from awooop.cli.runs import saga_name, status_name, step_status, step_type
from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.saga.v1 import saga_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.tools.v1 import tools_pb2
from awooop.worker.client import Client
from awooop.worker.errors import TOOL_FAILED, AwooopError
from awooop.worker.structs import from_struct, to_struct

T = TypeVar("T")
POLL = 0.2


class DemoFailed(Exception):
    pass


def register(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="walk the seeds' story end to end against `awooop up` (dedupe, crash, reaper, resume, reject, compensate)",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--project", default=None, help="project to use (default: a fresh demo-XXXXXX)")
    p.add_argument("--deployment", default="api", help="deployment the story scales (default api)")
    p.add_argument("--replicas", type=int, default=3, help="replicas to scale to (default 3)")
    p.add_argument("--lease-ttl", type=float, default=2.0, help="the demo workers' lease in seconds (default 2)")
    p.add_argument(
        "--reaper-timeout",
        type=float,
        default=150.0,
        help="how long to wait for the reaper to return the crashed worker's run (default 150 s)",
    )
    p.add_argument("--step-timeout", type=float, default=60.0, help="how long to wait for each other step")
    p.add_argument("--json", action="store_true", help="print a JSON summary on stdout; the story goes to stderr")
    add_connection_args(p)
    p.set_defaults(func=run_command(cmd_demo))


# --- worker processes -------------------------------------------------------------------------


@dataclass
class WorkerProcess:
    """A demo worker process (python -m awooop.worker.demo_worker); its stdout is JSON events."""

    name: str
    proc: asyncio.subprocess.Process
    log_path: Path
    events: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)
    seen: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    @property
    def pid(self) -> int:
        return self.proc.pid

    async def read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            try:
                event = json.loads(raw)
            except ValueError:
                continue
            self.seen.append(event)
            await self.events.put(event)
        await self.events.put({"event": "exited"})

    async def next_event(self, names: tuple[str, ...], timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DemoFailed(f"worker {self.name} sent none of {names} within {timeout:.0f} s{self.log_tail()}")
            try:
                event = await asyncio.wait_for(self.events.get(), left)
            except TimeoutError:
                continue
            if event["event"] in names:
                return event
            if event["event"] == "exited":
                raise DemoFailed(f"worker {self.name} exited unexpectedly{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()[-15:]
        except OSError:
            return ""
        return ("\n  worker log (" + str(self.log_path) + "):\n    " + "\n    ".join(lines)) if lines else ""

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGKILL)
            await self.proc.wait()

    async def terminate(self, timeout: float = 30) -> int:
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout)
            except TimeoutError:
                await self.kill()
        return self.proc.returncode if self.proc.returncode is not None else -1


async def spawn_worker(
    name: str, args: argparse.Namespace, client: Client, project: str, logdir: Path, pause_after: str | None
) -> WorkerProcess:
    cmd = [
        sys.executable,
        "-m",
        "awooop.worker.demo_worker",
        "--project",
        project,
        "--worker-id",
        f"demo-worker-{name.lower()}-{secrets.token_hex(2)}",
        "--lease-ttl",
        str(args.lease_ttl),
        "--heartbeat",
        str(max(0.1, args.lease_ttl / 4)),
        "--claim-wait",
        "5",
        "--scheduler",
        client.addresses["scheduler"],
        "--saga",
        client.addresses["saga"],
        "--gateway",
        client.addresses["gateway"],
    ]
    if pause_after:
        cmd += ["--pause-after", pause_after]
    env = {**os.environ, "AWOOOP_API_KEY": client.key}  # the key stays out of the process list
    if args.tls:
        env["AWOOOP_TLS"] = "true"
    if args.ca_file:
        env["AWOOOP_TLS_CA_FILE"] = args.ca_file
    log_path = logdir / f"worker-{name.lower()}.log"
    with open(log_path, "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *cmd, stdout=asyncio.subprocess.PIPE, stderr=log, env=env, stdin=asyncio.subprocess.DEVNULL
        )
    w = WorkerProcess(name, proc, log_path)
    w.reader = asyncio.create_task(w.read())
    return w


# --- the story --------------------------------------------------------------------------------


class Story:
    def __init__(self, out: Any) -> None:
        self.out = out
        self.n = 0
        self.lines: list[str] = []

    def step(self, text: str) -> None:
        self.n += 1
        self._print(f"{self.n:>2}. {text}")

    def detail(self, text: str) -> None:
        self._print(f"      {text}")

    def plain(self, text: str = "") -> None:
        self._print(text)

    def _print(self, line: str) -> None:
        self.lines.append(line)
        print(line, file=self.out, flush=True)


async def poll(check: Callable[[], Awaitable[T | None]], timeout: float, what: str) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise DemoFailed(f"timed out after {timeout:.0f} s waiting for {what}")
        await asyncio.sleep(POLL)


async def cmd_demo(args: argparse.Namespace, client: Client) -> int:
    story = Story(sys.stderr if args.json else sys.stdout)
    project = args.project or f"demo-{secrets.token_hex(3)}"
    summary: dict[str, Any] = {"project": project, "ok": False, "checks": {}}
    workers: list[WorkerProcess] = []
    logdir = Path(tempfile.mkdtemp(prefix="awooop-demo-"))
    started = time.monotonic()
    try:
        await _story(args, client, story, project, summary, workers, logdir)
        summary["ok"] = all(summary["checks"].values())
    except DemoFailed as exc:
        summary["error"] = str(exc)
        story.plain()
        story.plain(f"demo failed: {exc}")
    except AwooopError as err:
        summary["error"] = err.details.render()
        story.plain()
        story.plain(f"demo failed: {err.method or 'call'}: {err.details.render()}")
        if err.code == grpc.StatusCode.UNAVAILABLE:
            story.plain("is the suite running? start it with `./dev up` (or `awooop up`) in another terminal")
        if err.code == grpc.StatusCode.UNAUTHENTICATED:
            story.plain("pass --key or set AWOOOP_API_KEY (`awooop up` prints `export AWOOOP_API_KEY=...`)")
    finally:
        for w in workers:
            await w.kill()
    summary["seconds"] = round(time.monotonic() - started, 1)
    summary["worker_logs"] = str(logdir)
    if summary["ok"]:
        story.plain()
        story.plain(f"Done in {summary['seconds']} s. Look again with:")
        story.plain(f"  awooop runs show {summary['run_id']}")
        story.plain(f"  awooop runs list --project {project}")
    elif "error" not in summary:
        failed = [k for k, v in summary["checks"].items() if not v]
        story.plain(f"demo finished, but these checks failed: {', '.join(failed)}")
    if args.json:
        print_json(summary)
    return 0 if summary["ok"] else 1


@dataclass
class _Demo:
    """What every act of the demo's story reads and adds to."""

    args: argparse.Namespace
    client: Client
    story: Story
    project: str
    summary: dict[str, Any]
    workers: list[WorkerProcess]
    logdir: Path

    @property
    def checks(self) -> dict[str, bool]:
        checks: dict[str, bool] = self.summary["checks"]
        return checks


async def _story(
    args: argparse.Namespace,
    client: Client,
    story: Story,
    project: str,
    summary: dict[str, Any],
    workers: list[WorkerProcess],
    logdir: Path,
) -> None:
    """The story's acts in order, each printing its steps and adding to summary."""
    d = _Demo(args, client, story, project, summary, workers, logdir)
    a = client.addresses
    story.plain(f"awooop demo: project {project}")
    story.plain(f"  ingest {a['ingest']}  scheduler {a['scheduler']}  saga {a['saga']}  gateway {a['gateway']}")
    if not client.key:
        raise DemoFailed("no API key: pass --key, set AWOOOP_API_KEY, or run from the directory of `awooop up`")
    story.plain()
    await _create_deployment(d)
    run_id = await _deliver_three_times(d)
    wa, original, undo = await _worker_a_scales(d, run_id)
    wb = await _crash_and_reap(d, run_id, wa)
    approval = await _worker_b_resumes(d, run_id, wb)
    journal, comp = await _reject_and_compensate(d, run_id, approval, undo)
    await _journal_and_end(d, run_id, wb, journal, comp, original)


async def _create_deployment(d: _Demo) -> None:
    """Act 1: a deployment to scale, in the reference gateway."""
    client, story, project, deployment = d.client, d.story, d.project, d.args.deployment
    try:
        await client.call(
            client.gateway.ExecuteTool,
            tools_pb2.ExecuteToolRequest(
                tool_id="k8s_create_resource",
                params=to_struct({"kind": "Deployment", "name": deployment, "spec": {"replicas": 1}}),
                idempotency_key=f"demo-setup:{deployment}",
                project_id=project,
                reason="awooop demo setup",
            ),
        )
        story.step(f"The reference gateway has deployment {deployment} with 1 replica (project {project}).")
    except AwooopError as err:
        if err.reason != TOOL_FAILED:
            raise
        story.step(f"The reference gateway already has deployment {deployment} in project {project}.")


async def _deliver_three_times(d: _Demo) -> str:
    """Act 2: a Telegram update, delivered three times; returns the one run's id."""
    client, story, project = d.client, d.story, d.project
    update_id = secrets.randbelow(900_000_000) + 100_000_000
    text = f"/scale {d.args.deployment} {d.args.replicas}"
    payload = {
        "update_id": update_id,
        "message": {
            "message_id": secrets.randbelow(100_000),
            "date": int(time.time()),
            "chat": {"id": 4242, "type": "private"},
            "from": {"id": 4242, "username": "oncall"},
            "text": text,
        },
    }
    story.step(f'Telegram delivers update {update_id} ("{text}") three times, as a retrying bot does:')
    outcomes: list[dict[str, Any]] = []
    for i in range(3):
        resp = await client.call(
            client.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=project, channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=to_struct(payload)
            ),
        )
        o = resp.outcomes[0]
        outcomes.append({"run_id": o.run_id, "duplicate": o.duplicate, "code": o.code})
        story.detail(f"delivery {i + 1} -> run {o.run_id}  " + (f"duplicate ({o.code})" if o.duplicate else "new run"))
    run_id: str = outcomes[0]["run_id"]
    d.summary.update(run_id=run_id, update_id=update_id, deliveries=outcomes)
    d.checks["one_run_for_three_deliveries"] = len({o["run_id"] for o in outcomes}) == 1 and [
        o["duplicate"] for o in outcomes
    ] == [False, True, True]
    story.detail("one run, PENDING")
    return run_id


async def _worker_a_scales(d: _Demo, run_id: str) -> tuple[WorkerProcess, Any, dict[str, Any]]:
    """Act 3: worker A claims the run and journals two steps; returns worker A, the replicas
    before the scale and the journaled compensation's params."""
    args, client, story, deployment = d.args, d.client, d.story, d.args.deployment
    wa = await spawn_worker("A", args, client, d.project, d.logdir, pause_after="scale")
    d.workers.append(wa)
    d.summary["worker_a_pid"] = wa.pid
    claimed = await wa.next_event(("claimed",), args.step_timeout)
    _same_run(claimed, run_id)
    story.step(
        f"Worker A (pid {wa.pid}) claims the run: attempt {claimed['attempt']}, lease {args.lease_ttl:g} s "
        "kept alive by heartbeats."
    )
    diag = await wa.next_event(("step",), args.step_timeout)
    story.step(f'Worker A runs step "diagnose" (llm_call, journaled): {diag["result"].get("finding", "")}')
    await wa.next_event(("paused",), args.step_timeout)
    scale = await poll(lambda: _journal_step(client, run_id, "scale", common_pb2.STEP_STATUS_COMPLETED), 30, "step 2")
    result = from_struct(scale.result)
    original = result.get("previous_replicas")
    d.summary.update(replicas_before=original, replicas_scaled=result.get("replicas"))
    undo = from_struct(scale.compensation_cmd.params) if scale.HasField("compensation_cmd") else {}
    story.step(
        f'Worker A runs step "scale" (tool_call k8s_scale_deployment through the gateway): '
        f"{deployment} {original} -> {result.get('replicas')} replicas."
    )
    story.detail(
        f"idempotency key {run_id}:scale; compensation journaled: scale {deployment} back to {undo.get('replicas')}"
    )
    return wa, original, undo


async def _crash_and_reap(d: _Demo, run_id: str, wa: WorkerProcess) -> WorkerProcess:
    """Acts 4 and 5: worker A crashes, worker B starts, the reaper returns the run; returns worker B."""
    args, client, story, summary = d.args, d.client, d.story, d.summary
    await wa.kill()
    killed_at = time.monotonic()
    summary["worker_a_killed"] = True
    story.step("Worker A crashes (SIGKILL) before finishing; nobody renews its lease any more.")

    wb = await spawn_worker("B", args, client, d.project, d.logdir, pause_after=None)
    d.workers.append(wb)
    summary["worker_b_pid"] = wb.pid
    story.step(f"Worker B (pid {wb.pid}) starts and waits for work.")
    story.detail(
        f"waiting for the reaper: the lease ends {args.lease_ttl:g} s after the last heartbeat, the reaper runs every"
    )
    story.detail("AWOOOP_REAPER_INTERVAL seconds (2 under `awooop up`, 60 for a served scheduler) ...")
    waited = {"next": 15.0}

    async def reaped_yet() -> scheduler_pb2.RunEvent | None:
        event = await _history_event(client, run_id, "REAPED")
        if event is None and time.monotonic() - killed_at >= waited["next"]:
            story.detail(f"... still waiting for the reaper ({waited['next']:.0f} s)")
            waited["next"] += 15.0
        return event

    reaped = await poll(reaped_yet, args.reaper_timeout, "the reaper")
    after = time.monotonic() - killed_at
    summary["reaped_after_seconds"] = round(after, 1)
    d.checks["reaped"] = True
    story.step(
        f"The reaper finds the expired lease and returns the run to "
        f"{status_name(reaped.to_status)} ({after:.1f} s after the crash; attempt 1 counts)."
    )
    return wb


async def _worker_b_resumes(d: _Demo, run_id: str, wb: WorkerProcess) -> dict[str, Any]:
    """Act 6: worker B resumes, skipping the journaled steps, and asks for approval (returned)."""
    args, client, story, summary = d.args, d.client, d.story, d.summary
    claimed = await wb.next_event(("claimed",), args.step_timeout)
    _same_run(claimed, run_id)
    actions = {}
    for _ in range(2):
        ev = await wb.next_event(("step",), args.step_timeout)
        actions[ev["step_id"]] = ev["action"]
    summary["worker_b_attempt"] = claimed["attempt"]
    summary["worker_b_actions"] = actions
    d.checks["resumed_without_repeating_steps"] = actions == {"diagnose": "skip", "scale": "skip"}
    story.step(
        f"Worker B claims it (attempt {claimed['attempt']}) and replays the journal: "
        f"diagnose {_done(actions.get('diagnose'))}, scale {_done(actions.get('scale'))} "
        "(recorded results reused; the gateway is not called again)."
    )
    approval = await wb.next_event(("approval_requested",), args.step_timeout)
    run = await _run(client, run_id)
    story.step(f'Worker B asks for approval: "{run.approval_summary}"')
    story.detail(
        f"run {status_name(run.status)}, no lease held; the token (shown once, to the worker) "
        f"expires {when(run.approval_expires_at)}"
    )
    return approval


async def _reject_and_compensate(
    d: _Demo, run_id: str, approval: dict[str, Any], undo: dict[str, Any]
) -> tuple[saga_pb2.GetJournalResponse, dict[str, Any]]:
    """Acts 7 and 8: the approver rejects and the saga compensates; returns the journal and the
    undo's result."""
    client, story = d.client, d.story
    decided = await client.call(
        client.scheduler.DecideApproval,
        scheduler_pb2.DecideApprovalRequest(
            run_id=run_id,
            approval_token=approval["token"],
            decision=scheduler_pb2.DECISION_REJECT,
            reason="demo: the on-call lead says no",
        ),
    )
    d.summary["approval"] = "rejected"
    story.step(
        f"The approver ({decided.run.approval_decided_by or 'you'}) rejects: run {status_name(decided.run.status)} "
        f"({decided.run.error_code}); compensation requested: {str(decided.compensation_requested).lower()}."
    )

    journal = await poll(lambda: _compensated(client, run_id), d.args.step_timeout, "the compensation")
    event = await _history_event(client, run_id, "SAGA_STEP_COMPENSATED")
    comp = from_struct(event.details).get("result", {}) if event else {}
    d.summary["replicas_after_compensation"] = comp.get("replicas")
    story.step(
        f"The saga compensates in reverse order: k8s_scale_deployment {d.args.deployment} -> "
        f"{undo.get('replicas')} (gateway: {comp.get('previous_replicas', '?')} -> {comp.get('replicas', '?')} "
        f"replicas). saga_status {saga_name(journal.saga_status)}."
    )
    return journal, comp


async def _journal_and_end(
    d: _Demo,
    run_id: str,
    wb: WorkerProcess,
    journal: saga_pb2.GetJournalResponse,
    comp: dict[str, Any],
    original: Any,
) -> None:
    """Acts 9 and 10: the journal, and the end state."""
    story, summary, checks = d.story, d.summary, d.checks
    story.step("The journal (seed ADR-119 saga_steps):")
    steps = []
    for s in journal.steps:
        steps.append(
            {
                "seq": s.seq,
                "step_id": s.step_id,
                "step_type": step_type(s.step_type),
                "status": step_status(s.status),
                "attempt": s.attempt,
                "tool_id": s.tool_id,
                "result": from_struct(s.result) if s.HasField("result") else None,
            }
        )
        line = f"#{s.seq} {s.step_id:<9} {step_type(s.step_type):<16} {step_status(s.status):<12} attempt {s.attempt}"
        if s.tool_id:
            line += f"  {s.tool_id} {json.dumps(from_struct(s.tool_params), sort_keys=True)}"
        story.detail(line)
    summary["journal"] = steps
    summary["saga_status"] = saga_name(journal.saga_status)
    final = await _run(d.client, run_id)
    summary["run_status"] = status_name(final.status)
    summary["attempts"] = final.attempt_count
    checks["journal_compensated"] = [(s["step_id"], s["status"]) for s in steps[:2]] == [
        ("diagnose", "completed"),
        ("scale", "compensated"),
    ] and summary["saga_status"] == "compensated"
    checks["replicas_restored"] = original is not None and comp.get("replicas") == original
    checks["run_failed_by_rejection"] = final.status == common_pb2.RUN_STATUS_FAILED

    story.step(
        f"Gateway: deployment {d.args.deployment} is back at {_replicas(comp.get('replicas'))}, as before the run. "
        f"Run {summary['run_status']} after {final.attempt_count} attempts, saga {summary['saga_status']}."
    )
    rc = await wb.terminate()
    summary["worker_b_exit"] = rc
    story.detail(f"worker B stops on SIGTERM (exit {rc}): it holds no lease, nothing to hand back")


def _replicas(n: Any) -> str:
    return f"{n} replica" if n == 1 else f"{n} replicas"


def _done(action: str | None) -> str:
    return {"skip": "skipped", "execute": "EXECUTED AGAIN", "retry": "RETRIED"}.get(action or "", "?")


def _same_run(event: dict[str, Any], run_id: str) -> None:
    if event.get("run_id") != run_id:
        raise DemoFailed(f"a worker claimed run {event.get('run_id')}, not the demo's {run_id}: use a fresh --project")


async def _run(client: Client, run_id: str) -> common_pb2.Run:
    return (await client.call(client.scheduler.GetRun, scheduler_pb2.GetRunRequest(run_id=run_id))).run


async def _journal_step(client: Client, run_id: str, step_id: str, status: int) -> common_pb2.SagaStep | None:
    j = await client.call(client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id))
    return next((s for s in j.steps if s.step_id == step_id and s.status == status), None)


async def _history_event(client: Client, run_id: str, action: str) -> scheduler_pb2.RunEvent | None:
    h = await client.call(client.scheduler.GetRunHistory, scheduler_pb2.GetRunHistoryRequest(run_id=run_id))
    return next((e for e in h.events if e.action == action), None)


async def _compensated(client: Client, run_id: str) -> saga_pb2.GetJournalResponse | None:
    j = await client.call(client.saga.GetJournal, saga_pb2.GetJournalRequest(run_id=run_id))
    if j.saga_status in (common_pb2.SAGA_STATUS_COMPENSATED, common_pb2.SAGA_STATUS_COMPENSATION_FAILED):
        return j
    return None
