"""Every crash point of every documented worker pattern, enumerated (issue 41): a worker process
(tests/crash_worker.py) is SIGKILLed exactly before a call is sent, after the server answered it
but before the SDK saw the answer, and after the SDK saw it (tests/harness/crashpoints.py), for
each call the pattern makes; then a second worker takes the run over. Random kills find a race
window only sometimes; this visits each one.

Per pattern: one recorded run lists the calls (the crash points are each call, each phase); then
one run per crash point, each in a project of its own with a worker of its own that dies at that
point (a few at once), the test acting as the outside world meanwhile (posting the handed-out
callback URL, approving with the handed-out token, sending the awaited event); once they all died,
one worker for every project finishes the runs. Then, for every run and its children:

- it ended once (one terminal transition in its audit log), as the pattern ends;
- each tool call's side effect ran once (the reference gateway executed each idempotency key once);
- every callback URL handed out was honoured (the first post completed the wait, later ones
  answer 409, none 404), and the run got the posted result;
- a run that ended FAILED had every completed step undone exactly once, newest first.

Real services (ingest, scheduler, saga, the reference gateway), Postgres and Redis, real worker
processes over real channels."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import AwooopError, Client
from services.common.embedded import free_port
from services.common.settings import Settings
from tests.harness.crashpoints import Point, enumerate_points
from tests.harness.helpers import ROOT, eventually, internal_key, key_of, settings_env, spawn_services
from tests.harness.rpc_runs import ingest_run

# the services' loops act within a fraction of a second (tests/harness/suite.py QUICK, and the sweeps)
QUICK_ENV = {
    "AWOOOP_REAPER_INTERVAL": "0.1",
    "AWOOOP_RETRY_BACKOFF": "0.05",
    "AWOOOP_COMPENSATION_INTERVAL": "0.2",
    "AWOOOP_AUTH_CACHE_SECONDS": "0",
    "AWOOOP_APPROVAL_SWEEP_INTERVAL": "0.5",
    "AWOOOP_WAIT_SWEEP_INTERVAL": "0.2",
}
PATTERNS = ["steps", "fail", "callback", "approval", "sleep", "event", "parked_tool", "children", "stream"]
STREAMED = [f"{group}.{i} " for group in range(3) for i in range(5)]  # the stream pattern's tokens
AT_ONCE = 4  # crash workers alive at a time (2 cores)
TERMINAL = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass
class World:
    """The services, and the outside world the patterns talk to."""

    pool: asyncpg.Pool  # the test's many concurrent readers (one connection serves one at a time)
    env: dict[str, str]  # a worker process's environment (key, addresses)
    admin: Client
    http: str  # ingest's HTTP address (callback URLs)
    tmp: Path
    posted: dict[str, list[tuple[str, int]]] = field(default_factory=dict)  # run -> (url, status) posted


@pytest.fixture
async def world(settings: Settings, make_key: Any, tmp_path: Path) -> AsyncIterator[World]:
    """The services as processes of their own (a project per crash point: hundreds of projects,
    whose metrics must not use up the test process's label budget), acting quickly."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env = base | settings_env(settings) | QUICK_ENV
    env["AWOOOP_INTERNAL_API_KEY"] = await internal_key(settings.database_url)
    gw = await spawn_services(["gateway"], env, tmp_path, "gateway")
    http_port = free_port()
    ing = await spawn_services(["ingest"], env | {"AWOOOP_HTTP_PORT": str(http_port)}, tmp_path, "ingest")
    http = f"http://127.0.0.1:{http_port}"
    env |= {"AWOOOP_GATEWAY_ADDR": f"127.0.0.1:{gw.ports['gateway']}", "AWOOOP_WAIT_CALLBACK_BASE_URL": http}
    rt = await spawn_services(["scheduler", "saga"], env, tmp_path, "scheduler")
    # keys with their role in every project
    worker_key = key_of(await make_key("cp-worker", {"*": ["worker"]}, "service"))
    admin_key = key_of(await make_key("cp-admin", {"*": ["admin"]}))
    addrs = {
        "ingest": f"127.0.0.1:{ing.ports['ingest']}",
        "scheduler": f"127.0.0.1:{rt.ports['scheduler']}",
        "saga": f"127.0.0.1:{rt.ports['saga']}",
        "gateway": f"127.0.0.1:{gw.ports['gateway']}",
    }
    worker_env = base | {f"AWOOOP_{s.upper()}_ADDR": a for s, a in addrs.items()} | {"AWOOOP_API_KEY": worker_key}
    admin = Client(key=admin_key, **addrs)
    pool = await asyncpg.create_pool(settings.database_url, min_size=2, max_size=8)
    try:
        yield World(pool, worker_env, admin, http, tmp_path)
    finally:
        await admin.close()
        await pool.close()
        for sp in (rt, ing, gw):
            sp.terminate()


@contextlib.asynccontextmanager
async def worker(w: World, point: str, out: Path, projects: list[str]) -> AsyncIterator[subprocess.Popen[bytes]]:
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "log", "ab") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.crash_worker", point, str(out), *projects],
            env=w.env,
            cwd=ROOT,
            stdout=log,
            stderr=log,
        )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.to_thread(proc.wait, 15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def handed_out(out: Path, run_id: str, kind: str) -> list[str]:
    """What the worker handed out for the run, in order (a line still being written is not read)."""
    path = out / "handout"
    text = path.read_text() if path.exists() else ""
    lines = [json.loads(line) for line in text.split("\n")[:-1]]
    return [h["value"] for h in lines if h["run_id"] == run_id and h["kind"] == kind]


async def _post(url: str, body: dict[str, Any]) -> int:
    async with aiohttp.ClientSession() as s, s.post(url, json=body) as resp:
        return resp.status


async def drive(w: World, pattern: str, run_id: str, tag: str, outs: list[Path]) -> None:
    """The outside world of one run until it has ended: posts the first handed-out callback URL
    once the run parked on it, approves with the newest handed-out token, sends the awaited event."""
    sent = False
    tried: set[str] = set()
    while True:
        row = await w.pool.fetchrow(
            "SELECT status, wait_reason, worker_id, saga_status FROM awooop_run_state WHERE run_id = $1",
            uuid.UUID(run_id),
        )
        assert row is not None
        if row["status"] in TERMINAL:
            return
        parked = row["status"] == "WAITING_TOOL" and row["worker_id"] is None
        if pattern == "callback" and parked and not sent:
            urls = [u for out in outs for u in handed_out(out, run_id, "url")]
            if urls:
                status = await _post(urls[0], {"tag": tag})
                w.posted.setdefault(run_id, []).append((urls[0], status))
                sent = True
        if pattern == "event" and parked and row["wait_reason"] == "wait_event" and not sent:
            await ingest_run(w.admin, project_of(tag), {"correlation_key": tag, "tag": tag})
            sent = True
        if pattern == "approval" and row["status"] == "WAITING_APPROVAL":
            tokens = [t for out in outs for t in handed_out(out, run_id, "approval") if t not in tried]
            for token in tokens[-1:]:
                tried.add(token)
                with contextlib.suppress(AwooopError):  # a token lost with its answer: the run expires
                    await w.admin.call(
                        w.admin.scheduler.DecideApproval,
                        scheduler_pb2.DecideApprovalRequest(
                            run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_APPROVE
                        ),
                    )
        await asyncio.sleep(0.1)


def project_of(tag: str) -> str:
    return tag.rsplit("/", 1)[0]


async def start(w: World, pattern: str, project: str) -> tuple[str, str]:
    tag = f"{project}/{uuid.uuid4().hex[:8]}"
    return await ingest_run(w.admin, project, {"pattern": pattern, "tag": tag}), tag


async def settled(db: asyncpg.Pool, run_id: str) -> bool:
    """The run and its children ended, and a failed run's compensation is over."""
    rows = await db.fetch(
        "SELECT status, saga_status FROM awooop_run_state WHERE run_id = $1 OR parent_run_id = $1", uuid.UUID(run_id)
    )
    return all(
        r["status"] in TERMINAL and r["saga_status"] not in ("in_progress", "compensating") for r in rows
    ) and bool(rows)


# --- the invariants ---------------------------------------------------------------------------


async def ends(db: asyncpg.Connection, run_id: str) -> int:
    """How many times the run reached a terminal status (its audit log's transitions into one)."""
    n: int = await db.fetchval(
        "SELECT count(*) FROM awooop_audit_log WHERE run_id = $1::uuid AND to_status = ANY($2::text[])"
        " AND (from_status IS NULL OR from_status <> ALL($2::text[]))",
        run_id,
        list(TERMINAL),
    )
    return n


async def violations(
    w: World, db: asyncpg.Connection, pattern: str, run_id: str, tag: str, outs: list[Path]
) -> list[str]:
    found: list[str] = []
    tree = await db.fetch(
        "SELECT run_id::text, status, saga_status, output, error_code, parent_run_id FROM awooop_run_state"
        " WHERE run_id = $1 OR parent_run_id = $1 ORDER BY child_seq NULLS FIRST",
        uuid.UUID(run_id),
    )
    root = tree[0]
    for r in tree:
        if (n := await ends(db, r["run_id"])) != 1:
            found.append(f"{r['run_id']} ended {n} times")
        executed = await db.fetch(
            "SELECT idempotency_key, count(*) AS n FROM awooop_refgw_request"
            " WHERE idempotency_key LIKE $1 AND outcome = 'executed' GROUP BY idempotency_key ORDER BY min(request_id)",
            r["run_id"] + ":%",
        )
        twice = [e["idempotency_key"] for e in executed if e["n"] != 1]
        if twice:
            found.append(f"side effects repeated: {twice}")
        done = [
            e["idempotency_key"].split(":")[1] for e in executed if not e["idempotency_key"].endswith(":compensate")
        ]
        steps = sorted(done)
        undone = [
            e["idempotency_key"].split(":")[1]
            for e in await db.fetch(
                "SELECT idempotency_key FROM awooop_refgw_request WHERE idempotency_key LIKE $1"
                " AND outcome = 'executed' ORDER BY request_id",
                r["run_id"] + ":%:compensate",
            )
        ]
        expected_steps, expected_status = expect(pattern, r, root)
        if r["status"] != expected_status:
            found.append(f"{r['run_id']} ended {r['status']} ({r['error_code']}), expected {expected_status}")
        if steps != expected_steps:
            found.append(f"{r['run_id']} executed {steps}, expected {expected_steps}")
        if r["status"] == "COMPLETED" and root["status"] == "COMPLETED":
            if undone:
                found.append(f"{r['run_id']} completed but had {undone} undone")
        elif undone != done[::-1] or r["saga_status"] != "compensated":  # newest first
            found.append(f"{r['run_id']} {r['status']}: undone {undone} ({r['saga_status']}), executed {steps}")
    if pattern == "stream":
        found += await stream_violations(db, run_id)
    if pattern == "callback":
        urls = [u for out in outs for u in handed_out(out, run_id, "url")]
        answers = {u: await _post(u, {"late": True}) for u in urls}
        if not urls or any(code != 409 for code in answers.values()):
            found.append(f"handed-out URLs answered {answers} after the wait ended (expected 409 each)")
        if [s for _, s in w.posted.get(run_id, [])] != [200]:
            found.append(f"the posted callback answered {w.posted.get(run_id)}")
        output = json.loads(root["output"]) if root["output"] else None
        if root["status"] == "COMPLETED" and output != {"posted": {"tag": tag}}:
            found.append(f"output {output}")
    return found


async def stream_violations(db: asyncpg.Connection, run_id: str) -> list[str]:
    """Each attempt's checkpoints follow each other from seq 1, no token twice; the last attempt's
    (the one that completed) hold the whole stream."""
    rows = await db.fetch(
        "SELECT data FROM awooop_run_event WHERE run_id = $1::uuid AND kind = 'stream_checkpoint' ORDER BY seq",
        run_id,
    )
    by_attempt: dict[int, list[str]] = {}
    found = []
    for r in rows:
        d = json.loads(r["data"]) if isinstance(r["data"], str) else r["data"]
        tokens = by_attempt.setdefault(int(d["attempt"]), [])
        if d["first_seq"] != len(tokens) + 1:
            found.append(f"attempt {d['attempt']}'s checkpoint starts at {d['first_seq']} after {len(tokens)} tokens")
        tokens.extend(d["tokens"])
    if not by_attempt or by_attempt[max(by_attempt)] != STREAMED:
        found.append(f"checkpoints per attempt {by_attempt}, expected the last one to hold {STREAMED}")
    return found


def expect(pattern: str, r: asyncpg.Record, root: asyncpg.Record) -> tuple[list[str], str]:
    """(the tool steps that ran, the status) a run of the pattern ends with."""
    if r["parent_run_id"] is not None:
        return ["child"], "COMPLETED"
    if pattern == "fail":
        return ["a", "b"], "FAILED"
    if pattern == "approval" and r["status"] == "FAILED" and r["error_code"] == "E-APPROVAL-002":
        return ["a"], "FAILED"  # its token was lost with the answer that carried it: it expired
    return {
        "steps": ["a", "b"],
        "callback": ["a", "b"],
        "approval": ["a", "b"],
        "sleep": ["a", "b"],
        "event": ["a"],
        "parked_tool": ["a", "b", "deploy"],
        "children": ["a"],
        "stream": ["a"],
    }[pattern], "COMPLETED"


# --- the enumeration --------------------------------------------------------------------------


@pytest.mark.timeout(600)
@pytest.mark.parametrize("pattern", PATTERNS)
async def test_every_crash_point_of_the_pattern_keeps_the_invariants(
    world: World, db: asyncpg.Connection, pattern: str
) -> None:
    w = world
    # the calls the pattern makes, recorded on a run without a crash
    rec = w.tmp / f"{pattern}-record"
    project = f"cp-{pattern}--1"
    run_id, tag = await start(w, pattern, project)
    async with worker(w, "record", rec, [project]):
        await asyncio.gather(drive(w, pattern, run_id, tag, [rec]))
        await eventually(lambda: settled(w.pool, run_id), timeout=60, what=f"the recorded {pattern} run")
    assert await violations(w, db, pattern, run_id, tag, [rec]) == []
    labels = (rec / "calls").read_text().split()
    points = enumerate_points(labels)
    runs: list[tuple[Point, str, str, Path, str]] = []
    for i, point in enumerate(points):
        project = f"cp-{pattern}-{i}"
        run_id, tag = await start(w, pattern, project)
        runs.append((point, run_id, tag, w.tmp / f"{pattern}-{i}", project))
    drivers = [
        asyncio.create_task(drive(w, pattern, run_id, tag, [out, w.tmp / f"{pattern}-after"]))
        for _, run_id, tag, out, _ in runs
    ]
    unreached: list[str] = []
    gate = asyncio.Semaphore(AT_ONCE)

    async def crash(point: Point, out: Path, project: str) -> None:
        async with gate, worker(w, str(point), out, [project]) as proc:
            try:
                await asyncio.to_thread(proc.wait, 60)
            except subprocess.TimeoutExpired:
                unreached.append(str(point))
                return
            if proc.returncode != -signal.SIGKILL:
                unreached.append(f"{point} (exit {proc.returncode})")

    async def all_settled() -> bool:
        for d in drivers:  # a driver that failed says why now
            if d.done() and not d.cancelled() and d.exception() is not None:
                d.result()
        return all([await settled(w.pool, run_id) for _, run_id, *_ in runs])

    after = w.tmp / f"{pattern}-after"
    try:
        await asyncio.gather(*(crash(point, out, project) for point, _, _, out, project in runs))
        async with worker(w, "none", after, [p for *_, p in runs]):
            await eventually(all_settled, timeout=120, what=f"every {pattern} run settled")
    finally:
        for d in drivers:
            d.cancel()
    report = {}
    for point, run_id, tag, out, _ in runs:
        found = await violations(w, db, pattern, run_id, tag, [out, after])
        if found:
            report[str(point)] = found
    assert unreached == [], f"crash points never reached: {unreached}"
    assert report == {}, json.dumps(report, indent=1)
    print(f"{pattern}: {len(points)} crash points, calls {labels}")


# --- the cancel-point enumeration of a child tree ------------------------------------------------


async def tree_violations(w: World, db: asyncpg.Connection, parent: str, answer: str) -> list[str]:
    """A cancelled parent's tree: each run ended once; each side effect ran once; every step
    journaled completed of a run that failed or was cancelled, or whose parent was, undone exactly
    once, and what the cancel set undoing (requests from the parent's end on) undone children
    newest first, the parent last; a run of a tree that completed keeps its steps. The cancel's
    answer: "cancelled" (the parent ended CANCELLED at once), "requested" (it was leased: its
    worker may complete it before a heartbeat delivers the request), "refused" (it had completed)."""
    found: list[str] = []
    tree = await db.fetch(
        "SELECT r.run_id::text, r.status, r.parent_run_id::text, q.created_at AS requested,"
        "       (SELECT max(a.created_at) FROM awooop_audit_log a WHERE a.run_id = r.run_id"
        "           AND a.to_status = ANY($2::text[])) AS ended_at"
        "  FROM awooop_run_state r LEFT JOIN awooop_compensation_request q ON q.run_id = r.run_id"
        " WHERE r.run_id = $1 OR r.parent_run_id = $1 ORDER BY r.child_seq NULLS FIRST",
        uuid.UUID(parent),
        list(TERMINAL),
    )
    root = tree[0]
    allowed = {"cancelled": ("CANCELLED",), "requested": ("CANCELLED", "COMPLETED"), "refused": ("COMPLETED",)}
    if root["status"] not in allowed[answer]:
        found.append(f"the parent ended {root['status']} (cancel {answer})")
    unsuccessful = ("FAILED", "CANCELLED")
    for r in tree:
        if (n := await ends(db, r["run_id"])) != 1:
            found.append(f"{r['run_id']} ended {n} times")
        undo = r["status"] in unsuccessful or (r["parent_run_id"] is not None and root["status"] in unsuccessful)
        steps = await db.fetch(
            "SELECT step_id, status FROM awooop_saga_step WHERE run_id = $1::uuid AND step_type = 'tool_call'",
            r["run_id"],
        )
        kept = ("compensated", "pending", "failed") if undo else ("completed", "pending", "failed")
        wrong = [(s["step_id"], s["status"]) for s in steps if s["status"] not in kept]
        if wrong:
            found.append(f"{r['run_id']} ({r['status']}, undo {undo}) has steps {wrong}")
    twice = await db.fetch(
        "SELECT idempotency_key FROM awooop_refgw_request WHERE idempotency_key LIKE ANY($1::text[])"
        " AND outcome = 'executed' GROUP BY idempotency_key HAVING count(*) > 1",
        [r["run_id"] + ":%" for r in tree],
    )
    if twice:
        found.append(f"ran more than once: {[t['idempotency_key'] for t in twice]}")
    if root["status"] == "CANCELLED":  # what its end set undoing: newest child first, the parent last
        cascade = [r["run_id"] for r in tree if r["requested"] is not None and r["requested"] >= root["ended_at"]]
        undone = [
            k["idempotency_key"].split(":")[0]
            for k in await db.fetch(
                "SELECT idempotency_key FROM awooop_refgw_request WHERE idempotency_key LIKE ANY($1::text[])"
                " AND outcome = 'executed' ORDER BY request_id",
                [run + ":%:compensate" for run in cascade],
            )
        ]
        order = [run for run in [*(r["run_id"] for r in reversed(tree[1:])), parent] if run in undone]
        if undone != order:
            found.append(f"undone in the order {undone}, expected newest child first, the parent last: {order}")
    return found


@pytest.mark.timeout(600)
async def test_cancelling_a_parent_at_every_point_of_its_childrens_lives_undoes_the_tree_once_in_order(
    world: World, db: asyncpg.Connection
) -> None:
    """The parent of the tree pattern (its own tool step, then two children with one tool step each,
    the first of which then parks on a durable sleep and the second fails, compensated on its own)
    is cancelled with its worker frozen at each point of the tree's calls (each call, each phase: a
    child queued, claimed, mid-step, its step journaled, parked, completing, failing and being
    compensated, the parent parked or resuming), and once before any worker ran. Then the worker
    goes on: whatever any run of the tree completed is undone once, children newest first, before
    the parent's own step."""
    w = world
    rec = w.tmp / "tree-record"
    project = "cp-tree--1"
    parent, _ = await start(w, "tree", project)
    async with worker(w, "record", rec, [project]):
        await eventually(lambda: settled(w.pool, parent), timeout=60, what="the recorded tree")
    labels = (rec / "calls").read_text().split()
    points = ["queued", *(str(p) for p in enumerate_points(labels))]
    gate = asyncio.Semaphore(AT_ONCE)
    parents: dict[str, tuple[str, str]] = {}

    async def cancel(run_id: str, point: str) -> str:
        """Cancels the parent: cancelled, requested (leased), or refused (it had completed)."""
        request = scheduler_pb2.CancelRunRequest(run_id=run_id, reason=f"cancelled at {point}")
        try:
            resp = await w.admin.call(w.admin.scheduler.CancelRun, request)
        except AwooopError as err:
            assert err.details.metadata.get("status") == "COMPLETED", err
            return "refused"
        return "cancelled" if resp.run.status == common_pb2.RUN_STATUS_CANCELLED else "requested"

    async def cancel_at(i: int, point: str) -> None:
        project = f"cp-tree-{i}"
        out = w.tmp / f"tree-{i}"
        out.mkdir(parents=True, exist_ok=True)
        run_id, _ = await start(w, "tree", project)
        async with gate:
            if point == "queued":
                parents[point] = (run_id, await cancel(run_id, point))
            async with worker(w, "none" if point == "queued" else f"pause@{point}", out, [project]):
                if point != "queued":
                    await eventually(lambda: asyncio.to_thread((out / "paused").exists), timeout=60, what=point)
                    parents[point] = (run_id, await cancel(run_id, point))
                    (out / "go").touch()
                await eventually(lambda: settled(w.pool, run_id), timeout=90, what=f"the tree cancelled at {point}")

    await asyncio.gather(*(cancel_at(i, point) for i, point in enumerate(points)))
    report = {}
    for point, (run_id, answer) in parents.items():
        found = await tree_violations(w, db, run_id, answer)
        if found:
            report[point] = found
    assert report == {}, json.dumps(report, indent=1)
    answers = {a: [p for p, (_, given) in parents.items() if given == a] for a in ("requested", "refused")}
    print(f"tree: cancelled at {len(points)} points {answers}, calls {labels}")
