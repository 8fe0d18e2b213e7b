"""The TypeScript worker package (packages/worker-ts) as real node processes against the real
services (ingest, scheduler, saga, gateway; real Postgres and Redis): a worker SIGKILLed inside a
tool step whose run is reaped and finished by another worker (the step retried with the same
idempotency key), a claim whose answer was lost retried with its claim id, lease loss and cancel
reaching the handler through ctx.signal at the next heartbeat, a throwing handler failing its
attempts, a stale token's LEASE_LOST from the handler's own call, a full worker's completions
carried by its claims and one bad completion failing only its own run, approvals that resume the handler
with completed steps skipped, durable waits (a token's callback URL, a timeout, a sleep), event waits
(ctx.waitForEvent: an API correlation key from the look-back, a Telegram chat, an Alertmanager
group's resolve, each matched by the server's key of the event) and parked tool calls
(ctx.callToolParked: the tool outlives a SIGKILLed worker and posts to the callback URL, runs
once, compensates, posts an error, times out), each journaled and answered from the journal when
the handler runs again, child runs (ctx.runChildren, ctx.startChild: the parent parked until its
children ended, then answered their outcomes), and SIGTERM: handlers finish in the grace period or are
handed back, settling calls retried through hangs and UNAVAILABLE, a claim answered after the
signal handed back, and a non-zero exit naming the runs it could not settle. The package's own
unit tests (`npm test`, node's test runner) run here too.

The handler is packages/worker-ts/test/worker.ts: each run's input.mode says what it does."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Client, Event, Tokens, from_struct, to_struct, watch_run
from tests.harness import rpc_proxy
from tests.harness import suite as suite_harness
from tests.harness.helpers import eventually, key_of, start_with_callbacks
from tests.harness.scheduler import audit_actions, claims_waiting
from tests.harness.suite import start_suite
from tests.harness.ts_package import build_package, need
from tests.harness.wire import HoldingProxy

PROJECT = "tsw"


@pytest.fixture(scope="module")
def package() -> Path:
    return build_package()


@dataclass
class Suite(suite_harness.Suite):
    package: Path
    tool_gateway: str = ""  # the tool gateway's address, where a test started one for its workers

    async def create_runs(self, *inputs: dict[str, Any], **kw: Any) -> list[str]:
        return await self.ingest_each(inputs, **kw)

    async def status_is(self, run_id: str, status: int) -> bool:
        return (await self.run(run_id)).status == status


@pytest.fixture
async def suite(start_services: Any, make_key: Any, package: Path) -> AsyncIterator[Suite]:
    rt, worker_key, admin, _ = await start_suite(
        start_services, make_key, PROJECT, worker="ts-pod", admin="boss", wait_sweep_interval=0.2
    )
    yield Suite(rt, PROJECT, worker_key, admin, package)
    await admin.close()


@dataclass
class NodeWorker:
    """A real node process running the package's test worker; events on stdout, its log on stderr."""

    proc: subprocess.Popen[bytes]
    out: Path
    err: Path

    def events(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.out.read_text().splitlines() if line.startswith("{")]

    def log(self) -> str:
        return self.err.read_text()

    def text(self) -> str:
        return f"stdout:\n{self.out.read_text()}\nstderr:\n{self.log()}"

    async def event(self, kind: str, *, timeout: float = 30, **match: Any) -> dict[str, Any]:
        """The first event of that kind (with those fields), waited for."""

        async def found() -> dict[str, Any]:  # {}: not yet
            assert self.proc.poll() is None or any(e["event"] == kind for e in self.events()), self.text()
            return next(
                (e for e in self.events() if e["event"] == kind and all(e.get(k) == v for k, v in match.items())),
                {},
            )

        return await eventually(found, timeout=timeout, what=f"event {kind} {match}")

    async def sigterm(self) -> int:
        """SIGTERM; the exit code."""
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, 60)

    def stats(self) -> dict[str, int]:
        return next(e for e in self.events() if e["event"] == "exited")["stats"]  # type: ignore[no-any-return]


@contextlib.asynccontextmanager
async def node_worker(
    suite: Suite, tmp_path: Path, name: str = "w", *, scheduler: str | None = None, **options: Any
) -> AsyncIterator[NodeWorker]:
    """A node worker on the suite's services (or on `scheduler`: a proxy); options are WorkerOptions."""
    config = {"projects": [PROJECT], "concurrency": 1, "leaseTtl": 30, "heartbeatInterval": 0.3, "claimWait": 2}
    if suite.tool_gateway:
        config["gateway"] = suite.tool_gateway
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {
        "AWOOOP_API_KEY": suite.worker_key,
        "AWOOOP_SCHEDULER_ADDR": scheduler or suite.scheduler,
        "AWOOOP_SAGA_ADDR": suite.saga,
    }
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "wb") as stdout, open(err, "wb") as stderr:
        proc = subprocess.Popen(
            [need("node"), "test/dist/worker.js", json.dumps(config | options)],
            cwd=suite.package,
            env=env,
            stdout=stdout,
            stderr=stderr,
        )
    worker = NodeWorker(proc, out, err)
    try:
        yield worker
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


async def steps_of(db: Any, run_id: str) -> dict[str, Any]:
    rows = await db.fetch(
        "SELECT step_id, step_type, status, attempt, compensation_cmd FROM awooop_saga_step "
        "WHERE run_id = $1 ORDER BY seq",
        run_id,
    )
    return {r["step_id"]: r for r in rows}


def test_the_packages_own_unit_tests_pass(package: Path) -> None:
    """`npm test` in the package: node's test runner over its unit tests (settings, the metrics'
    names and labels, spans with the OpenTelemetry SDK, the /metrics and /healthz endpoint)."""
    out = subprocess.run([need("npm"), "test"], cwd=package, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{out.stdout}\n{out.stderr}"
    counts = dict(re.findall(r"^# (pass|fail|cancelled) (\d+)$", out.stdout, re.M))
    assert int(counts["pass"]) > 0 and counts["fail"] == counts["cancelled"] == "0", out.stdout


async def test_a_worker_killed_mid_step_has_its_run_reaped_and_finished_by_another(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """SIGKILL inside the tool step: nothing settles the run, so it stays RUNNING until its 2 s
    lease expires; the reaper takes it back and a second worker finishes it, skipping the LLM step
    the first completed and retrying the pending tool step with the same idempotency key."""
    [run_id] = await suite.create_runs({"mode": "scale", "block_attempt": 1})
    async with node_worker(suite, tmp_path, "first", leaseTtl=2, heartbeatInterval=0.5) as first:
        inside = await first.event("inside-scale", run_id=run_id)
        first.proc.kill()
        first.proc.wait()
    assert inside["attempt"] == 1 and inside["retry"] is False
    assert (await suite.run(run_id)).status == common_pb2.RUN_STATUS_RUNNING  # killed: nobody settled it

    async with node_worker(suite, tmp_path, "second", leaseTtl=30) as second:
        await eventually(
            lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="finished by another"
        )
        retried = await second.event("inside-scale", run_id=run_id)
        assert await second.sigterm() == 0, second.text()
    assert retried["attempt"] == 2 and retried["retry"] is True
    assert retried["key"] == inside["key"] == f"{run_id}:scale"
    run = await suite.run(run_id)
    assert run.attempt_count == 2 and dict(run.output) == {"attempt": 2, "replicas": 3}
    assert "REAPED" in [e.action for e in await suite.history(run_id)]
    steps = await steps_of(db, run_id)
    assert list(steps) == ["diagnose", "scale"]
    assert steps["diagnose"]["attempt"] == 1 and steps["diagnose"]["status"] == "completed"  # skipped on attempt 2
    assert steps["scale"]["step_type"] == "tool_call" and steps["scale"]["status"] == "completed"
    assert json.loads(steps["scale"]["compensation_cmd"]) == {
        "tool_id": "k8s_scale_deployment",
        "params": {"deployment": "api", "replicas": 1},
        "reason": "scale back",
    }


async def test_lease_loss_aborts_the_handler_at_the_next_heartbeat_and_the_pending_step_is_retried(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """The reaper takes the run back while attempt 1 waits inside a tool call on nothing but
    call.signal: only a heartbeat answering LEASE_LOST can abort it. Attempt 2 (the same worker,
    its slot free again) finds the step pending and runs it again with the same key."""
    [run_id] = await suite.create_runs({"mode": "scale", "block_attempt": 1})
    async with node_worker(suite, tmp_path) as worker:
        await worker.event("inside-scale", run_id=run_id, attempt=1)

        async def reaped() -> bool:
            # make the lease look expired until the real reaper has taken the run (a heartbeat in
            # between renews it, hence the loop)
            await db.execute(
                "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' "
                "WHERE run_id = $1 AND status = 'RUNNING' AND attempt_count = 1",
                run_id,
            )
            return bool(
                await db.fetchval("SELECT reaped_at IS NOT NULL FROM awooop_run_state WHERE run_id = $1", run_id)
            )

        await eventually(reaped, timeout=20, what="the reaper to take the run")
        aborted = await worker.event("step-aborted", run_id=run_id)
        retried = await worker.event("inside-scale", run_id=run_id, attempt=2)
        await eventually(lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="done")
        assert await worker.sigterm() == 0, worker.text()
    assert aborted == {"event": "step-aborted", "run_id": run_id, "attempt": 1, "why": "lease_lost"}
    assert retried["retry"] is True and retried["key"] == f"{run_id}:scale"
    assert worker.stats()["lost"] == 1 and worker.stats()["completed"] == 1
    run = await suite.run(run_id)
    assert run.attempt_count == 2 and run.output["attempt"] == 2


async def test_a_stale_token_answers_lease_lost_and_the_worker_leaves_the_run_alone(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """Heartbeats far apart: the handler's own journal write is what meets the moved-on token.
    It fails LEASE_LOST (a LeaseLost error); the worker neither fails nor completes the run."""
    [run_id] = await suite.create_runs({"mode": "stale"})
    async with node_worker(suite, tmp_path, heartbeatInterval=20, leaseTtl=60) as worker:
        await worker.event("waiting", run_id=run_id)
        # another claim took over: the fencing token moved on
        await db.execute("UPDATE awooop_run_state SET attempt_count = attempt_count + 1 WHERE run_id = $1", run_id)
        worker.proc.send_signal(signal.SIGUSR2)

        async def lost() -> bool:
            return "lease lost; handler stopped" in worker.log()

        await eventually(lost, timeout=20, what="lease lost")
        assert await worker.sigterm() == 0, worker.text()
    assert worker.stats()["lost"] == 1 and worker.stats()["failed"] == 0
    run = await suite.run(run_id)
    assert run.status == common_pb2.RUN_STATUS_RUNNING and run.attempt_count == 2
    assert await db.fetchval("SELECT count(*) FROM awooop_saga_step WHERE run_id = $1", run_id) == 0


async def test_a_cancel_request_aborts_the_handler_and_is_acknowledged(suite: Suite, tmp_path: Path) -> None:
    [run_id] = await suite.create_runs({"mode": "cancel"})
    async with node_worker(suite, tmp_path) as worker:
        await worker.event("prepared", run_id=run_id)
        resp = await suite.admin.call(
            suite.admin.scheduler.CancelRun, scheduler_pb2.CancelRunRequest(run_id=run_id, reason="operator says stop")
        )
        assert resp.run.cancel_requested and resp.run.status == common_pb2.RUN_STATUS_RUNNING
        stopped = await worker.event("stopped", run_id=run_id)
        await eventually(lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_CANCELLED), timeout=20, what="ack")
        assert await worker.sigterm() == 0, worker.text()
    assert stopped["why"] == "cancel_requested"
    assert worker.stats()["cancelled"] == 1
    last = (await suite.history(run_id))[-1]
    assert last.action == "CANCELLED" and last.to_status == common_pb2.RUN_STATUS_CANCELLED
    assert "ts-pod" in last.actor  # acknowledged by the worker's principal


async def test_an_approval_resumes_the_handler_and_skips_completed_steps(suite: Suite, db: Any, tmp_path: Path) -> None:
    [run_id] = await suite.create_runs({"mode": "approval"})
    async with node_worker(suite, tmp_path) as worker:
        requested = await worker.event("approval-requested", run_id=run_id)
        run = await suite.run(run_id)
        assert run.status == common_pb2.RUN_STATUS_WAITING_APPROVAL and run.approval_summary == "Apply the change?"
        await suite.admin.call(
            suite.admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id,
                approval_token=requested["token"],
                decision=scheduler_pb2.DECISION_APPROVE,
                reason="looks right",
            ),
        )
        await eventually(lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="done")
        assert await worker.sigterm() == 0, worker.text()
    assert [e["actions"] for e in worker.events() if e["event"] == "actions"] == [
        {"prepare": "execute", "approval": "execute"},
        {"prepare": "skip", "approval": "retry"},
    ]
    assert [e["resumed"] for e in worker.events() if e["event"] == "handler-started"] == [False, True]
    assert (await suite.run(run_id)).output["approved_by"] == "boss"
    steps = await steps_of(db, run_id)
    assert [(s["step_id"], s["step_type"], s["status"]) for s in steps.values()] == [
        ("prepare", "callback", "completed"),
        ("approval", "approval_request", "completed"),
        ("apply", "callback", "completed"),
    ]


async def test_a_durable_wait_parks_the_run_and_the_callback_url_resumes_it_with_finished_steps_skipped(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    waiting, timing_out, sleeping = await suite.create_runs(
        {"mode": "wait"}, {"mode": "wait", "timeout": 0.5}, {"mode": "sleep", "seconds": 0.5}
    )
    async with node_worker(suite, tmp_path, concurrency=3) as worker:
        created = await worker.event("wait-created", run_id=waiting)
        assert created["callback_url"].startswith("/v1/waits/")  # no AWOOOP_WAIT_CALLBACK_BASE_URL: the path

        async def parked() -> bool:
            row = await db.fetchrow(
                "SELECT status, worker_id, lease_until FROM awooop_run_state WHERE run_id = $1", waiting
            )
            return bool(row["status"] == "WAITING_TOOL" and row["worker_id"] is None and row["lease_until"] is None)

        await eventually(parked, timeout=20, what="the run parked, holding no lease")
        # the timeout reaches the handler; the sleep ends by its time
        await worker.event("timed-out", run_id=timing_out)
        await eventually(lambda: suite.status_is(sleeping, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="slept")
        url = f"http://127.0.0.1:{suite.rt.http_ports['ingest']}{created['callback_url']}"
        async with aiohttp.ClientSession() as http, http.post(url, json={"build": "green"}) as r:
            assert r.status == 200, await r.text()
        await eventually(lambda: suite.status_is(waiting, common_pb2.RUN_STATUS_COMPLETED), timeout=20, what="resumed")
        assert await worker.sigterm() == 0, worker.text()
    assert (await suite.run(waiting)).output["posted"] == {"build": "green"}
    assert (await suite.run(timing_out)).output["timed_out"] is True
    assert [e["run_id"] for e in worker.events() if e["event"] == "ran-before"].count(waiting) == 1
    [actions] = [e["actions"] for e in worker.events() if e["event"] == "actions"]
    assert actions == {"before": "skip", "wait-1:outcome": "execute"}
    assert worker.stats()["parked"] == 3  # each run parked once and was settled by being parked
    steps = await steps_of(db, waiting)
    assert [(s["step_id"], s["step_type"], s["status"]) for s in steps.values()] == [
        ("before", "callback", "completed"),
        ("wait-1", "callback", "completed"),
        ("wait-1:outcome", "callback", "completed"),
    ]


async def test_child_runs_park_the_parent_until_they_end_and_answer_their_outcomes(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """ctx.runChildren (one completes, one fails), ctx.startChild with handle.result(), and a
    runChildren timeout: each parent parks holding no lease and runs again from the top once its
    children ended, as the Python SDK's run_children and start_child."""
    both, handle, timing_out = await suite.create_runs(
        {"mode": "children"}, {"mode": "child-handle"}, {"mode": "children-timeout"}
    )
    async with node_worker(suite, tmp_path, concurrency=3) as worker:
        for run_id in (both, handle, timing_out):
            await eventually(
                lambda r=run_id: suite.status_is(r, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what=f"{run_id} done"
            )
        started = await worker.event("child-started", run_id=handle)
        assert await worker.sigterm() == 0, worker.text()
    outcomes = (await suite.run(both)).output["outcomes"]
    assert [(o["step_id"], o["status"], o["ok"]) for o in outcomes] == [
        ("child-1", "completed", True),
        ("child-2", "failed", False),
    ]
    assert outcomes[0]["output"] == {"ok": True}
    kids = await db.fetch(
        "SELECT run_id::text, parent_step_id, child_depth, status FROM awooop_run_state"
        " WHERE parent_run_id = $1 ORDER BY parent_step_id",
        both,
    )
    assert [(k["run_id"], k["parent_step_id"], k["child_depth"], k["status"]) for k in kids] == [
        (outcomes[0]["run_id"], "child-1", 1, "COMPLETED"),
        (outcomes[1]["run_id"], "child-2", 1, "FAILED"),
    ]
    # the parent parked once (no lease held meanwhile) and answered from its children when it ran again
    assert "WAIT_PARKED" in await audit_actions(db, both)
    starts = [e for e in worker.events() if e["event"] == "handler-started" and e["run_id"] == both]
    assert len(starts) == 2 and starts[1]["resumed"], starts
    [actions] = [e["actions"] for e in worker.events() if e["event"] == "actions" and e["run_id"] == both]
    assert actions == {"children-1": "children"}
    # the handle: the same child found again by the resumed attempt, its output read from it
    done = (await suite.run(handle)).output
    assert done["child"] == started["child"] and started["started"] is True
    assert done["status"] == "completed" and done["output"] == {"ok": True}
    assert (await suite.run(timing_out)).output["children_timed_out"] == "children-1"


# --- event waits and parked tool calls: the Python SDK's semantics ---


GROUP = '{}/{severity="page"}:{alertname="DiskFull"}'  # a groupKey as Alertmanager builds it
CHAT = -1001234567890  # a Telegram group chat's id (negative)


async def send_event(suite: Suite, channel: int, payload: dict[str, Any]) -> str:
    """A channel event (its payload is its run's input, which the matcher reads); its run id."""
    resp = await suite.admin.call(
        suite.admin.ingest.IngestEvent,
        ingest_pb2.IngestEventRequest(
            project_id=PROJECT,
            channel_type=channel,  # type: ignore[arg-type]
            provider_event_id=f"evt-{os.urandom(6).hex()}",
            payload=to_struct(payload),
        ),
    )
    return str(resp.outcomes[0].run_id)


async def open_event_wait(db: Any, run_id: str) -> bool:
    row = await db.fetchrow(
        "SELECT r.status, w.status AS wait FROM awooop_run_state r JOIN awooop_wait w USING (run_id)"
        " WHERE r.run_id = $1 AND w.kind = 'event'",
        run_id,
    )
    return bool(row is not None and row["status"] == "WAITING_TOOL" and row["wait"] == "open")


async def test_wait_for_event_parks_until_the_matching_channel_event_and_answers_it_from_the_journal_after(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """ctx.waitForEvent with each match of the vocabulary: an API correlation key whose event came
    before the wait (the look-back), a Telegram chat and an Alertmanager group whose events come
    while the run is parked (the server's match key of each event equals the key the package sent:
    the chat id's decimal text, the group key's md5). Events of other keys and a firing alert do
    not match. A run that fails the attempt that received its event gets the same event back from
    the journal (the outcome step skipped, nothing awaited). A timeout reaches the handler; a
    malformed match throws before anything is sent."""
    api = common_pb2.CHANNEL_TYPE_API
    early = await send_event(suite, api, {"correlation_key": "order-9", "paid": True, "mode": "quick"})
    by_key, by_chat, by_group, timing_out, malformed = await suite.create_runs(
        {"mode": "event", "match": "order-9", "throw_after_event": True},
        {"mode": "event", "match": {"channel": "telegram", "chatId": CHAT}},
        {"mode": "event", "match": {"channel": "alertmanager", "groupKey": GROUP}},
        {"mode": "event", "match": {"channel": "api", "correlationKey": "never"}, "timeout": 0.5},
        {"mode": "event", "match": {"channel": "telegram", "chatId": "ops"}},
    )
    async with node_worker(suite, tmp_path, concurrency=4) as worker:
        for run_id in (by_chat, by_group):
            await eventually(functools.partial(open_event_wait, db, run_id), timeout=30, what="parked on its event")
        # other chats, other groups and a firing notification of the group: no match
        await send_event(suite, common_pb2.CHANNEL_TYPE_TELEGRAM, telegram_update(7001, 555, "other chat"))
        await send_event(suite, common_pb2.CHANNEL_TYPE_ALERTMANAGER, {"groupKey": GROUP, "status": "firing"})
        await send_event(suite, common_pb2.CHANNEL_TYPE_ALERTMANAGER, {"groupKey": "{}:other", "status": "resolved"})
        await worker.event("timed-out", run_id=timing_out)  # the sweep passed (0.2 s) more than once meanwhile
        assert await open_event_wait(db, by_chat) and await open_event_wait(db, by_group)
        reply = await send_event(suite, common_pb2.CHANNEL_TYPE_TELEGRAM, telegram_update(7002, CHAT, "yes"))
        resolve = await send_event(
            suite, common_pb2.CHANNEL_TYPE_ALERTMANAGER, {"groupKey": GROUP, "status": "resolved"}
        )
        for run_id in (by_key, by_chat, by_group, timing_out, malformed):
            done = functools.partial(suite.status_is, run_id, common_pb2.RUN_STATUS_COMPLETED)
            await eventually(done, timeout=30, what=f"{run_id} completed")
        assert await worker.sigterm() == 0, worker.text()
    outputs = {run_id: from_struct((await suite.run(run_id)).output) for run_id in (by_key, by_chat, by_group)}
    assert outputs[by_key]["event_run_id"] == early and outputs[by_key]["payload"]["paid"] is True
    assert outputs[by_chat]["event_run_id"] == reply and outputs[by_chat]["payload"]["message"]["text"] == "yes"
    assert outputs[by_group]["event_run_id"] == resolve
    assert dict((await suite.run(timing_out)).output) == {"timed_out": True}
    bad = str(from_struct((await suite.run(malformed)).output)["bad_match"])
    assert "telegram chatId must be an integer" in bad, bad
    assert await db.fetchval("SELECT count(*) FROM awooop_wait WHERE run_id = $1", malformed) == 0
    # the attempt that received the event failed; the next got the same event from the journal
    got = [e for e in worker.events() if e["event"] == "got-event" and e["run_id"] == by_key]
    assert [e["actions"]["event-1:outcome"] for e in got] == ["execute", "skip"], got
    assert got[0]["got"] == got[1]["got"] and got[1]["attempt"] == got[0]["attempt"] + 1
    steps = await steps_of(db, by_chat)
    assert [(s["step_id"], s["step_type"], s["status"]) for s in steps.values()] == [
        ("event-1", "callback", "completed"),
        ("event-1:outcome", "callback", "completed"),
    ]
    keys = await db.fetch(
        "SELECT w.run_id::text, w.match_channel, w.match_key,"
        " (SELECT awooop_event_key(r.channel_type, r.input) FROM awooop_run_state r"
        "   WHERE r.run_id = (w.result ->> 'run_id')::uuid) AS event_key"
        " FROM awooop_wait w WHERE w.kind = 'event' AND w.status = 'completed'"
    )
    assert {r["run_id"]: (r["match_channel"], r["match_key"], r["event_key"]) for r in keys} == {
        by_key: ("api", "order-9", "order-9"),
        by_chat: ("telegram", str(CHAT), str(CHAT)),
        by_group: ("alertmanager", hashlib.md5(GROUP.encode()).hexdigest(), hashlib.md5(GROUP.encode()).hexdigest()),
    }


def telegram_update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    """A message update as Telegram posts it (core.telegram.org/bots/api#update)."""
    chat = {"id": chat_id, "type": "supergroup", "title": "ops"}
    return {
        "update_id": update_id,
        "message": {"message_id": update_id, "date": 1441645532, "chat": chat, "text": text},
    }


@pytest.fixture
async def parked_suite(start_services: Any, make_key: Any, package: Path) -> AsyncIterator[Suite]:
    """The services with the reference gateway, and the scheduler issuing callback URLs on ingest's
    HTTP address (where the gateway posts a parked tool call's outcome)."""
    gw, ing, rt = await start_with_callbacks(start_services)
    worker_key = key_of(await make_key("ts-parker", {PROJECT: ["worker"]}, "service"))
    admin_key = key_of(await make_key("parked-boss", {PROJECT: ["admin"]}))
    admin = Client(
        key=admin_key,
        ingest=f"127.0.0.1:{ing.ports['ingest']}",
        scheduler=f"127.0.0.1:{rt.ports['scheduler']}",
        saga=f"127.0.0.1:{rt.ports['saga']}",
    )
    yield Suite(rt, PROJECT, worker_key, admin, package, tool_gateway=f"127.0.0.1:{gw.ports['gateway']}")
    await admin.close()


async def tool_requests(db: Any, key: str) -> list[str]:
    """The gateway's log of ExecuteTool calls with this idempotency key: their outcomes."""
    rows = await db.fetch(
        "SELECT outcome FROM awooop_refgw_request WHERE project_id = $1 AND idempotency_key = $2 ORDER BY request_id",
        PROJECT,
        key,
    )
    return [r["outcome"] for r in rows]


async def test_a_parked_tool_call_outlives_its_sigkilled_worker_runs_once_and_compensates(
    parked_suite: Suite, db: Any, tmp_path: Path
) -> None:
    """ctx.callToolParked: the run parks while the gateway's tool works; the worker is SIGKILLed
    meanwhile and another finishes the run from the tool's post, without calling the tool again
    (and, when a later step fails once, the next attempt skips the completed tool step). The step
    compensates like any tool step; a tool that posts an error throws ParkedToolFailed (the step
    journaled failed); one that posts too late times the run out (E-WAIT-TIMEOUT)."""
    suite = parked_suite
    survivor, failing, erring, late = await suite.create_runs(
        {"mode": "parked-tool", "delay_ms": 4000, "then": "flaky"},
        {"mode": "parked-tool", "then": "fail"},
        {"mode": "parked-tool", "tool_error": "quota exceeded"},
        {"mode": "parked-tool", "delay_ms": 10000, "timeout": 1},
    )
    async with node_worker(suite, tmp_path, "first", concurrency=4) as first:

        async def parked() -> bool:
            row = await db.fetchrow("SELECT status, worker_id FROM awooop_run_state WHERE run_id = $1", survivor)
            return bool(row["status"] == "WAITING_TOOL" and row["worker_id"] is None)

        await eventually(parked, timeout=30, what="the run parked on its tool")
        assert await tool_requests(db, f"{survivor}:deploy") == ["received"]  # the tool is at work
        first.proc.kill()
        first.proc.wait()
    async with node_worker(suite, tmp_path, "second", concurrency=4) as second:
        await eventually(
            lambda: suite.status_is(survivor, common_pb2.RUN_STATUS_COMPLETED), timeout=60, what="resumed and done"
        )
        for run_id, status in ((failing, "FAILED"), (erring, "COMPLETED"), (late, "FAILED")):
            done = functools.partial(suite.status_is, run_id, getattr(common_pb2, f"RUN_STATUS_{status}"))
            await eventually(done, timeout=60, what=f"{run_id} {status}")

        await eventually(
            lambda: _is(db, failing, "compensated"), timeout=30, what="the failed run's tool step compensated"
        )
        assert await second.sigterm() == 0, second.text()
    events = first.events() + second.events()
    # the survivor: "before" ran once; the tool ran once; its outcome came through the callback URL
    assert [e["run_id"] for e in events if e["event"] == "ran-before"].count(survivor) == 1
    assert await tool_requests(db, f"{survivor}:deploy") == ["executed"]
    calls = "SELECT count(*) FROM awooop_refgw_call WHERE idempotency_key = $1"
    assert await db.fetchval(calls, f"{survivor}:deploy") == 1
    wait = await db.fetchrow("SELECT status, completed_by FROM awooop_wait WHERE run_id = $1", survivor)
    assert (wait["status"], wait["completed_by"]) == ("completed", "callback:wait-url")
    finished = [e for e in second.events() if e["event"] == "tool-done" and e["run_id"] == survivor]
    assert [e["actions"].get("deploy") for e in finished] == ["retry", "skip"], finished  # resumed, then skipped
    assert finished[0]["actions"]["deploy:wait:outcome"] == "execute"
    assert finished[0]["result"] == finished[1]["result"]
    assert dict((await suite.run(survivor)).output)["tool_result"] == {"entry_id": f"kb-{survivor}", "created": True}
    steps = await steps_of(db, survivor)
    assert [(s["step_id"], s["status"]) for s in steps.values()] == [
        ("before", "completed"),
        ("deploy", "completed"),
        ("deploy:wait", "completed"),
        ("deploy:wait:outcome", "completed"),
        ("after", "completed"),
    ]
    assert steps["deploy"]["step_type"] == "tool_call" and json.loads(steps["deploy"]["compensation_cmd"]) == {
        "tool_id": "knowledge_delete",
        "params": {"entry_id": f"kb-{survivor}"},
        "reason": "undo deploy",
    }
    # failing: the written entry is deleted by the compensation
    assert (await steps_of(db, failing))["deploy"]["status"] == "compensated"
    assert await db.fetchval("SELECT count(*) FROM awooop_refgw_knowledge WHERE entry_id = $1", f"kb-{failing}") == 0
    # erring: the tool's error reached the handler; the step failed, nothing to undo
    assert dict((await suite.run(erring)).output) == {"tool_failed": "quota exceeded", "code": "TOOL_FAILED"}
    assert (await steps_of(db, erring))["deploy"]["status"] == "failed"
    # late: timed out before the tool posted
    run = await suite.run(late)
    assert run.error_code == "E-WAIT-TIMEOUT", run
    assert (await steps_of(db, late))["deploy"]["status"] == "failed"


async def _is(db: Any, run_id: str, saga_status: str) -> bool:
    return bool(await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id) == saga_status)


async def test_a_claim_whose_answer_was_lost_is_retried_with_its_id_and_handled_under_its_lease(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """The scheduler claims the run but the answer never arrives (a stalled network: the claim's
    deadline passes). The worker sends the claim again with the same claim id, and the scheduler
    answers it with that claim's lease: the run is handled at once, in its first attempt, instead
    of staying RUNNING until its 600 s lease expires."""
    proxy = await HoldingProxy(suite.rt.ports["scheduler"]).start()
    try:
        async with node_worker(
            suite, tmp_path, scheduler=f"127.0.0.1:{proxy.port}", leaseTtl=600, claimWait=1, callTimeout=2
        ) as worker:
            await eventually(lambda: claims_waiting(1), what="the worker's long-poll")
            proxy.held = True
            [run_id] = await suite.create_runs({"mode": "quick"})
            await eventually(
                lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_RUNNING), what="the scheduler to claim it"
            )

            async def claim_failed() -> bool:
                return "claim failed; retrying" in worker.log()

            await eventually(claim_failed, timeout=20, what="the worker's claim to fail (its answer was lost)")
            assert not [e for e in worker.events() if e["event"] == "handler-started"]
            await proxy.reset()  # the network comes back
            await eventually(
                lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_COMPLETED),
                timeout=20,
                what="the run handled under the lost claim's lease",
            )
            assert await worker.sigterm() == 0, worker.text()
    finally:
        await proxy.close()
    started = [(e["run_id"], e["attempt"]) for e in worker.events() if e["event"] == "handler-started"]
    assert started == [(run_id, 1)]
    assert (await audit_actions(db, run_id)).count("CLAIMED") == 1
    assert await db.fetchval("SELECT count(DISTINCT claim_id) FROM awooop_claim_answer") == 1


async def test_a_full_workers_completions_ride_on_its_next_claim(suite: Suite, db: Any, tmp_path: Path) -> None:
    """Concurrency 1 and four runs waiting: each run that finishes is completed by the ClaimRuns
    that claims the next (ClaimRunsRequest.complete), so no CompleteRuns call is needed."""
    runs = await suite.create_runs(*[{"mode": "quick"}] * 4)
    async with node_worker(suite, tmp_path, concurrency=1) as worker:
        for run_id in runs:
            done = functools.partial(suite.status_is, run_id, common_pb2.RUN_STATUS_COMPLETED)
            await eventually(done, timeout=20, what=f"{run_id} completed")
        assert await worker.sigterm() == 0, worker.text()
    stats = worker.stats()
    assert stats["completed"] == 4 and stats["completionsCarried"] == 4 and stats["completeRunsCalls"] == 0, stats
    for run_id in runs:
        assert (await suite.run(run_id)).output["ok"] is True
        assert (await audit_actions(db, run_id)).count("COMPLETED") == 1


async def test_one_bad_completion_in_a_batch_does_not_fail_the_others(suite: Suite, tmp_path: Path) -> None:
    """Three handlers of a full worker return at once, one output over AWOOOP_MAX_PAYLOAD_BYTES.
    Their completions ride on the next ClaimRuns, which the scheduler refuses as a whole
    (INVALID_ARGUMENT); sent again with CompleteRuns, refused as a whole again; then item by item
    (CompleteRun), so only the oversized run's completion fails."""
    first, second, oversized = await suite.create_runs(
        {"mode": "together"}, {"mode": "together"}, {"mode": "together", "output_bytes": 300 * 1024}
    )
    async with node_worker(suite, tmp_path, concurrency=3) as worker:
        for run_id in (first, second, oversized):
            await worker.event("waiting", run_id=run_id)
        worker.proc.send_signal(signal.SIGUSR2)
        for run_id in (first, second):
            done = functools.partial(suite.status_is, run_id, common_pb2.RUN_STATUS_COMPLETED)
            await eventually(done, timeout=20, what=f"{run_id} completed")

        async def refused() -> bool:
            return "could not record the run as completed" in worker.log()

        await eventually(refused, timeout=20, what="the oversized completion refused")
        assert await worker.sigterm() == 0, worker.text()
    refusals = [json.loads(line) for line in worker.log().splitlines() if "could not record the run" in line]
    assert [(r["run_id"], r["error"].split(":")[0]) for r in refusals] == [(oversized, "AwooopError")], refusals
    assert "INVALID_ARGUMENT" in refusals[0]["error"] and "output" in refusals[0]["error"], refusals
    assert worker.stats()["completed"] == 2 and worker.stats()["completeRunsCalls"] == 1, worker.stats()


async def test_a_handler_that_throws_fails_the_attempt_until_attempts_are_used(suite: Suite, tmp_path: Path) -> None:
    [run_id] = await suite.create_runs({"mode": "throw"}, max_attempts=2)
    async with node_worker(suite, tmp_path) as worker:
        await eventually(lambda: suite.status_is(run_id, common_pb2.RUN_STATUS_FAILED), timeout=30, what="failed")
        assert await worker.sigterm() == 0, worker.text()
    assert [e["attempt"] for e in worker.events() if e["event"] == "handler-started"] == [1, 2]
    run = await suite.run(run_id)
    assert run.error_code == "E-WORKER-HANDLER" and "Error: bad input on attempt 2" in run.failure_reason


async def test_a_key_without_the_worker_role_makes_the_worker_exit_non_zero(
    suite: Suite, make_key: Any, tmp_path: Path
) -> None:
    suite.worker_key = key_of(await make_key("intruder", {"elsewhere": ["worker"]}))
    async with node_worker(suite, tmp_path) as worker:
        rc = await asyncio.to_thread(worker.proc.wait, 30)
    assert rc == 1 and "WorkerError: ClaimRuns: PERMISSION_DENIED" in worker.log(), worker.text()


# --- SIGTERM ---


SIGTERM_OPTIONS: dict[str, Any] = {
    "concurrency": 2,
    "leaseTtl": 60,
    "heartbeatInterval": 1,
    "shutdownGrace": 1,
    "callTimeout": 10,
}


async def handlers_started(worker: NodeWorker, n: int) -> None:
    """n handlers run: the worker holds those runs (the database says RUNNING as soon as the
    claim commits, before the worker has the answer)."""

    async def started() -> bool:
        return sum(e["event"] == "handler-started" for e in worker.events()) >= n  # type: ignore[no-any-return]

    await eventually(started, timeout=30, what=f"{n} handlers started")


async def test_sigterm_finishes_or_hands_back_every_lease(suite: Suite, db: Any, tmp_path: Path) -> None:
    finish, hold = await suite.create_runs({"mode": "finish"}, {"mode": "hold"})
    async with node_worker(suite, tmp_path, **SIGTERM_OPTIONS) as worker:
        await handlers_started(worker, 2)
        rc = await worker.sigterm()
    assert rc == 0, worker.text()
    rows = await suite.run_rows(db)
    assert rows[finish]["status"] == "COMPLETED", worker.text()
    assert json.loads(rows[finish]["output"]) == {"finished_during_grace": True}
    await suite.assert_handed_back(rows[hold])
    assert worker.stats()["completed"] == 1 and worker.stats()["released"] == 1


async def test_sigterm_settles_every_run_when_settling_calls_hang_or_fail_unavailable(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    """Each settling call first hangs until its deadline, then fails UNAVAILABLE more often than
    the channel's own retries cover (the completion's failures come after the scheduler did it:
    the answer is lost). The worker sends them again with backoff: every run still ends completed
    or handed back."""
    finish, hold = await suite.create_runs({"mode": "finish"}, {"mode": "hold"})
    async with suite.scheduler_proxy() as proxy:
        proxy.add("CompleteRuns", rpc_proxy.hang(), *[rpc_proxy.lose_answer()] * 4)
        proxy.add("ReleaseRun", rpc_proxy.hang(), *[rpc_proxy.fail()] * 4)
        options = SIGTERM_OPTIONS | {"shutdownGrace": 3, "callTimeout": 3}
        async with node_worker(suite, tmp_path, scheduler=proxy.address, **options) as worker:
            await handlers_started(worker, 2)
            rc = await worker.sigterm()
        assert proxy.faulted["CompleteRuns"] == 5 and proxy.faulted["ReleaseRun"] == 5, worker.text()
    assert rc == 0, worker.text()
    rows = await suite.run_rows(db)
    assert rows[finish]["status"] == "COMPLETED", worker.text()
    assert json.loads(rows[finish]["output"]) == {"finished_during_grace": True}
    await suite.assert_handed_back(rows[hold])


async def test_a_claim_answer_arriving_after_sigterm_is_handed_back(suite: Suite, db: Any, tmp_path: Path) -> None:
    """The scheduler claimed both runs, then SIGTERM comes before its answer reaches the worker:
    the worker waits for the answer and hands both runs back without starting their handlers."""
    runs = await suite.create_runs({"mode": "finish"}, {"mode": "hold"})
    async with suite.scheduler_proxy() as proxy:
        proxy.add("ClaimRuns", rpc_proxy.hold_answer())
        async with node_worker(suite, tmp_path, scheduler=proxy.address, **SIGTERM_OPTIONS) as worker:

            async def claimed() -> bool:
                return proxy.answered.is_set()

            await eventually(claimed, timeout=30, what="the scheduler to answer the claim")
            worker.proc.send_signal(signal.SIGTERM)

            async def stopping() -> bool:
                return "worker stopping" in worker.log()

            await eventually(stopping, timeout=30, what="the worker to begin stopping")
            proxy.release.set()
            rc = await asyncio.to_thread(worker.proc.wait, 30)
        assert proxy.cancelled["ClaimRuns"] == 0
    assert rc == 0, worker.text()
    assert not [e for e in worker.events() if e["event"] == "handler-started"], worker.text()
    rows = await suite.run_rows(db)
    for run_id in runs:
        await suite.assert_handed_back(rows[run_id])


async def test_runs_the_worker_cannot_settle_make_it_exit_non_zero_naming_them(
    suite: Suite, db: Any, tmp_path: Path
) -> None:
    runs = await suite.create_runs({"mode": "finish"}, {"mode": "hold"})
    async with suite.scheduler_proxy() as proxy:
        proxy.always["CompleteRuns"] = proxy.always["ReleaseRun"] = rpc_proxy.fail(grpc.StatusCode.UNAVAILABLE)
        options = SIGTERM_OPTIONS | {"callTimeout": 1}
        async with node_worker(suite, tmp_path, scheduler=proxy.address, **options) as worker:
            await handlers_started(worker, 2)
            rc = await worker.sigterm()
    text = worker.log()
    assert rc == 1, worker.text()
    assert "could not settle 2 runs" in text and all(run_id in text for run_id in runs), text
    rows = await suite.run_rows(db)
    assert all(rows[run_id]["status"] == "RUNNING" for run_id in runs)


async def _approve(suite: Suite, run_id: str, token: str) -> None:
    await suite.admin.call(
        suite.admin.scheduler.DecideApproval,
        scheduler_pb2.DecideApprovalRequest(
            run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_APPROVE
        ),
    )


async def test_builds_replay_checks_and_patches_of_the_typescript_sdk(suite: Suite, tmp_path: Path) -> None:
    """Two runs park at an approval on TS build v1, whose process is then SIGTERMed (the rollout).
    One is moved to v2-reordered (its steps swapped): held, nothing of v2 ran, then unheld onto v1
    and finished there. The other is moved to v2-patched: it takes the old path of the patch; a
    run v2-patched starts takes the new one. Every step ran once."""
    old_reordered, old_patched = await suite.create_runs({"mode": "versioned"}, {"mode": "versioned"})
    tokens: dict[str, str] = {}
    async with node_worker(suite, tmp_path, "v1", buildId="v1", concurrency=2) as v1:
        for r in (old_reordered, old_patched):
            tokens[r] = (await v1.event("approval-requested", run_id=r))["token"]
        assert await v1.sigterm() == 0, v1.text()
    for r, build in ((old_reordered, "v2-reordered"), (old_patched, "v2-patched")):
        assert (await suite.run(r)).build_id == "v1"
        await suite.admin.call(
            suite.admin.scheduler.SetRunBuild, scheduler_pb2.SetRunBuildRequest(run_id=r, build_id=build)
        )

    async with node_worker(suite, tmp_path, "v2r", buildId="v2-reordered") as v2r:
        await _approve(suite, old_reordered, tokens[old_reordered])

        async def held() -> bool:
            run = await suite.run(old_reordered)
            return run.status == common_pb2.RUN_STATUS_PENDING and run.wait_reason == "held"

        await eventually(held, timeout=30, what="the reordered replay held")
        assert await v2r.sigterm() == 0, v2r.text()
    run = await suite.run(old_reordered)
    assert run.error_code == "E-WORKER-NONDETERMINISM" and "'plan'" in run.failure_reason
    assert [e for e in v2r.events() if e["event"] == "step"] == []  # nothing of v2's code ran
    assert any(e["event"] == "exited" and e["stats"]["held"] == 1 for e in v2r.events()), v2r.text()

    async with node_worker(suite, tmp_path, "v2p", buildId="v2-patched", concurrency=2) as v2p:
        await _approve(suite, old_patched, tokens[old_patched])
        await eventually(lambda: suite.status_is(old_patched, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="old")
        [fresh] = await suite.create_runs({"mode": "versioned"})
        token = (await v2p.event("approval-requested", run_id=fresh))["token"]
        await _approve(suite, fresh, token)
        await eventually(lambda: suite.status_is(fresh, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="fresh")
        assert await v2p.sigterm() == 0, v2p.text()
    assert (await suite.run(old_patched)).output["patched"] is False
    assert (await suite.run(fresh)).output["patched"] is True

    await suite.admin.call(
        suite.admin.scheduler.UnholdRun, scheduler_pb2.UnholdRunRequest(run_id=old_reordered, build_id="v1")
    )
    async with node_worker(suite, tmp_path, "v1b", buildId="v1") as v1b:
        await eventually(lambda: suite.status_is(old_reordered, common_pb2.RUN_STATUS_COMPLETED), timeout=30, what="v1")
        assert await v1b.sigterm() == 0, v1b.text()
    assert (await suite.run(old_reordered)).output["finished_on"] == "v1"
    ran = [(e["run_id"], e["step"]) for w in (v1, v2r, v2p, v1b) for e in w.events() if e["event"] == "step"]
    assert sorted(s for r, s in ran if r == old_reordered) == ["apply", "fetch", "plan"]
    assert sorted(s for r, s in ran if r == old_patched) == ["apply", "fetch", "plan"]
    assert sorted(s for r, s in ran if r == fresh) == ["apply", "check", "fetch", "plan"]


async def test_labels_of_the_typescript_sdk_route_runs_and_children_to_the_worker_that_has_them(
    suite: Suite, tmp_path: Path
) -> None:
    """A TS worker labelled gpu=a100 beside an unlabelled one: the runs that require the label,
    and the children a parent starts with it, run only on the labelled worker; ListWorkers shows
    its labels."""
    labelled = await suite.create_runs({"mode": "quick"}, {"mode": "quick"}, required_labels={"gpu": "a100"})
    [parent] = await suite.create_runs({"mode": "labelled-children"})
    async with (
        node_worker(suite, tmp_path, "gpu", workerId="ts-gpu", labels={"gpu": "a100"}, concurrency=2) as gpu,
        node_worker(suite, tmp_path, "cpu", workerId="ts-cpu", concurrency=2) as cpu,
    ):
        for r in (*labelled, parent):
            await eventually(lambda r=r: suite.status_is(r, common_pb2.RUN_STATUS_COMPLETED), timeout=60, what=r)
        workers = await suite.admin.call(
            suite.admin.scheduler.ListWorkers, scheduler_pb2.ListWorkersRequest(project_id=PROJECT)
        )
        assert {w.worker_id: dict(w.labels) for w in workers.workers} == {"ts-gpu": {"gpu": "a100"}, "ts-cpu": {}}
        assert await gpu.sigterm() == 0 and await cpu.sigterm() == 0, gpu.text() + cpu.text()
    children = (await suite.run(parent)).output["children"]
    on_gpu = {e["run_id"] for e in gpu.events() if e["event"] == "handler-started"}
    on_cpu = {e["run_id"] for e in cpu.events() if e["event"] == "handler-started"}
    assert set(labelled) | set(children) <= on_gpu and not (set(labelled) | set(children)) & on_cpu


async def test_the_typescript_sdk_streams_tokens_and_watches_them(suite: Suite, tmp_path: Path) -> None:
    """ctx.streamToken and ctx.pipeTokens (an emit between: checkpointed first) in a node worker;
    a Python watcher gets every token once, in order; the log's checkpoints hold them all; and a
    second run's handler watching the first with the TypeScript watchRun({ tokens: true }) gets
    the same text without a gap."""
    words = [f"w{i} " for i in range(1, 401)]
    (streamer,) = await suite.create_runs({"mode": "stream", "count": 400})
    (watcher,) = await suite.create_runs({"mode": "watch-tokens", "target": streamer})
    seen: list[Any] = []

    async def python_watch() -> common_pb2.Run:
        async for item in watch_run(suite.admin, streamer, tokens=True):
            if isinstance(item, common_pb2.Run):
                return item
            seen.append(item)
        raise AssertionError("the watch ended without the run")

    watching = asyncio.create_task(python_watch())
    async with node_worker(suite, tmp_path, concurrency=2) as w:
        ended = await asyncio.wait_for(watching, 60)
        await eventually(lambda: suite.status_is(watcher, common_pb2.RUN_STATUS_COMPLETED), what="the TS watcher's run")
        assert w.proc.poll() is None, w.text()
    assert from_struct(ended.output) == {"streamed": 400, "piped": len("".join(words[200:]))}
    batches = [i for i in seen if isinstance(i, Tokens)]
    assert [t for b in batches for t in b.tokens] == words
    assert [s for b in batches for s in range(b.first_seq, b.last_seq + 1)] == list(range(1, 401))
    progress = [e for e in seen if isinstance(e, Event) and e.source == "progress"]
    assert progress[0].kind == "stream_checkpoint" and "half" in [e.kind for e in progress]
    assert [t for e in progress if e.kind == "stream_checkpoint" for t in e.data["tokens"]] == words
    out = from_struct((await suite.run(watcher)).output)
    assert out["text"] == "".join(words) and out["gaps"] == 0
