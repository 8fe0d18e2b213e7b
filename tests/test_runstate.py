"""The run state machine of services/common/runstate.py, against the real store.

Every (status, action) pair: a run is put in the status, the action is tried through the
real service (or the real background pass), and the result must be what the transition
table says: an allowed action ends in one of its outcomes with that outcome's audit row; a
refused one changes nothing and, when it is an RPC, answers the error the table chooses.
The table is also checked against the places that restate it: the store's CHECK constraint,
the protobuf RunStatus enum and the README's diagram (the lists of statuses written out in SQL:
tests/test_status_sets.py)."""

from __future__ import annotations

import hashlib
import re
import uuid
from typing import Any

import grpc
import pytest

from awooop.common.v1 import common_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from services.common import errors
from services.common.runstate import (
    CANCELLABLE,
    CLAIMABLE,
    LEASED,
    STATUSES,
    TERMINAL,
    TRANSITIONS,
    Action,
    Refusal,
    RunStatus,
    fenced_refusal,
)
from services.common.validate import to_struct
from services.scheduler import hand_back, waits
from tests.harness.helpers import ROOT, eventually, expect_error, reason_of
from tests.harness.scheduler import Sched, audit_actions, insert_runs, lease, make_sched, run_row, snapshot

TOKEN = "t" * 43  # an approval token as RequestApproval issues them (token_urlsafe(32))
PAIRS = [(status, action) for status in STATUSES for action in Action]


async def _put_in(s: Sched, status: RunStatus, action: Action) -> str:
    """One run of project "p" in `status`, as the service leaves runs there: attempt 1
    (token (run_id, 1)), a live lease when leased, a live approval token when waiting for
    approval. The action's own precondition is arranged too: an expired lease for the reaper,
    an expired token for the sweep, a requested cancel for AcknowledgeCancel."""
    (run_id,) = await insert_runs(s.db, "p", 1)
    leased = status in LEASED
    await s.db.execute(
        """UPDATE awooop_run_state
              SET status = $2::text, attempt_count = 1,
                  worker_id = CASE WHEN $3 THEN 'w1' END,
                  heartbeat_at = CASE WHEN $3 THEN now() - interval '1 minute' END,
                  lease_until = CASE WHEN $3 AND $4 THEN now() - interval '1 second'
                                     WHEN $3 THEN now() + interval '5 minutes' END,
                  cancel_requested = $5,
                  approval_token_hash = CASE WHEN $2::text = 'WAITING_APPROVAL' THEN $6::bytea END,
                  approval_expires_at = CASE WHEN $2::text <> 'WAITING_APPROVAL' THEN NULL
                                             WHEN $7 THEN now() - interval '1 second'
                                             ELSE now() + interval '15 minutes' END,
                  output = CASE WHEN $2::text = 'COMPLETED' THEN '{}'::jsonb END
            WHERE run_id = $1""",
        uuid.UUID(run_id),
        status.value,
        leased,
        action is Action.REAP,
        leased and action is Action.ACKNOWLEDGE_CANCEL,
        hashlib.sha256(TOKEN.encode()).digest(),
        action is Action.EXPIRE_APPROVAL,
    )
    if action is Action.UNHOLD and status is RunStatus.PENDING:  # held, as HoldRun leaves a run
        await s.db.execute(
            "UPDATE awooop_run_state SET not_before = 'infinity', wait_reason = 'held' WHERE run_id = $1",
            uuid.UUID(run_id),
        )
    if action in (Action.PARK, Action.COMPLETE_WAIT, Action.EXPIRE_WAIT):
        # a durable wait of the run; for its completion or timeout a WAITING_TOOL run is parked on
        # it (no lease), as AwaitWait leaves it. The sweep's wait comes due in a second, so the
        # snapshot before the action is taken before any sweep can end it.
        parked = status is RunStatus.WAITING_TOOL and action is not Action.PARK
        if parked:
            await s.db.execute(
                "UPDATE awooop_run_state SET worker_id = NULL, lease_until = NULL WHERE run_id = $1", uuid.UUID(run_id)
            )
        await s.db.execute(
            """WITH w AS (INSERT INTO awooop_wait (project_id, run_id, step_id, kind, expires_at, parked_attempt)
                          VALUES ('p', $1, 'w', 'token', now() + make_interval(secs => $3), $4) RETURNING wait_id)
               INSERT INTO awooop_wait_token (token_hash, wait_id) SELECT $2, wait_id FROM w""",
            uuid.UUID(run_id),
            hashlib.sha256(run_id.encode()).digest(),
            1.0 if action is Action.EXPIRE_WAIT else 600.0,
            1 if parked else None,
        )
    return run_id


async def _wait_of(s: Sched, run_id: str) -> str:
    return str(await s.db.fetchval("SELECT wait_id FROM awooop_wait WHERE run_id = $1", uuid.UUID(run_id)))


async def _expire_wait(s: Sched, run_id: str) -> None:
    """The timeout sweep, once the run's wait is due (the service's own sweep may end it first:
    either way it ends once)."""

    async def due() -> bool:
        return bool(
            await s.db.fetchval("SELECT expires_at <= now() FROM awooop_wait WHERE run_id = $1", uuid.UUID(run_id))
        )

    await eventually(due, timeout=5, what="the wait due")
    await waits.expire(s.pool)

    async def ended() -> bool:  # ours, or the service's sweep that held it (SKIP LOCKED) meanwhile
        return bool(
            await s.db.fetchval("SELECT status <> 'open' FROM awooop_wait WHERE run_id = $1", uuid.UUID(run_id))
        )

    await eventually(ended, timeout=5, what="the wait ended")


async def _act(s: Sched, action: Action, run_id: str) -> Any:
    """Tries the action on the run; returns the RPC's error, or None."""
    w, tok = s.worker, lease(run_id, 1)
    calls = {
        Action.COMPLETE: lambda: s.stub.CompleteRun(pb.CompleteRunRequest(lease=tok, output=to_struct({})), metadata=w),
        Action.FAIL: lambda: s.stub.FailRun(pb.FailRunRequest(lease=tok, reason="boom", retryable=True), metadata=w),
        Action.RELEASE: lambda: s.stub.ReleaseRun(pb.ReleaseRunRequest(lease=tok), metadata=w),
        Action.WAIT_TOOL: lambda: s.stub.WaitTool(pb.WaitToolRequest(lease=tok, tool_id="t"), metadata=w),
        Action.RESUME_TOOL: lambda: s.stub.ResumeTool(pb.ResumeToolRequest(lease=tok), metadata=w),
        Action.ACKNOWLEDGE_CANCEL: lambda: s.stub.AcknowledgeCancel(pb.AcknowledgeCancelRequest(lease=tok), metadata=w),
        Action.REQUEST_APPROVAL: lambda: s.stub.RequestApproval(
            pb.RequestApprovalRequest(lease=tok, summary="ok?"), metadata=w
        ),
        Action.APPROVE: lambda: s.stub.DecideApproval(
            pb.DecideApprovalRequest(run_id=run_id, approval_token=TOKEN, decision=pb.DECISION_APPROVE),
            metadata=s.approver,
        ),
        Action.REJECT: lambda: s.stub.DecideApproval(
            pb.DecideApprovalRequest(run_id=run_id, approval_token=TOKEN, decision=pb.DECISION_REJECT),
            metadata=s.approver,
        ),
        Action.CANCEL: lambda: s.stub.CancelRun(pb.CancelRunRequest(run_id=run_id), metadata=s.approver),
        Action.HOLD: lambda: s.stub.HoldRun(pb.HoldRunRequest(lease=tok, reason="replay differs"), metadata=w),
        Action.UNHOLD: lambda: s.stub.UnholdRun(pb.UnholdRunRequest(run_id=run_id), metadata=s.approver),
        Action.SET_BUILD: lambda: s.stub.SetRunBuild(
            pb.SetRunBuildRequest(run_id=run_id, build_id="v2"), metadata=s.approver
        ),
    }
    wait_id = await _wait_of(s, run_id) if action in (Action.PARK, Action.COMPLETE_WAIT) else ""
    if action is Action.CLAIM:
        await s.claim("w2")
        return None
    if action is Action.HAND_BACK:  # the claim of attempt 1 (from PENDING) did not deliver it
        claimed = {"run_id": uuid.UUID(run_id), "attempt_count": 1, "from_status": RunStatus.PENDING.value}
        await hand_back.hand_back(s.db, [claimed], "w1", "test", hand_back.NO_ROOM)
        return None
    if action is Action.REAP:
        await s.reap()
        return None
    if action is Action.EXPIRE_APPROVAL:
        await s.expire_approvals()
        return None
    if action is Action.EXPIRE_WAIT:
        await _expire_wait(s, run_id)
        return None
    if action is Action.PARK:
        calls[action] = lambda: s.stub.AwaitWait(pb.AwaitWaitRequest(lease=tok, wait_id=wait_id), metadata=w)
    if action is Action.COMPLETE_WAIT:
        calls[action] = lambda: s.stub.CompleteWait(pb.CompleteWaitRequest(wait_id=wait_id), metadata=w)
    if action is Action.REDRIVE:  # a bulk operator action: refused statuses are simply not picked
        await s.stub.RedriveRuns(pb.RedriveRunsRequest(project_id="p"), metadata=s.admin)
        return None
    try:
        await calls[action]()
    except grpc.aio.AioRpcError as err:
        return err
    return None


@pytest.mark.parametrize(("status", "action"), PAIRS, ids=[f"{s.value}-{a.value}" for s, a in PAIRS])
async def test_every_status_and_action_pair_does_what_the_table_says(
    start_services: Any, channels: Any, db: Any, make_key: Any, status: RunStatus, action: Action
) -> None:
    s = await make_sched(start_services, channels, db, make_key)
    t = TRANSITIONS[action]
    run_id = await _put_in(s, status, action)
    before = await snapshot(s, run_id)
    err = await _act(s, action, run_id)
    row = await run_row(db, run_id)
    if status in t.allowed_from:
        assert err is None, (status, action, err and err.details())
        audit = await db.fetch(
            "SELECT action, from_status, to_status FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id",
            uuid.UUID(run_id),
        )
        last = audit[-1]
        assert len(audit) == before[1] + 1, audit  # one audit row for the change
        outcome = next(o for o in t.outcomes if (o.audit, o.to or status) == (last["action"], row["status"]))
        assert row["status"] == (outcome.to or status), (row["status"], outcome)
        assert (last["from_status"], last["to_status"]) == (status, row["status"])
        return
    if action is Action.REQUEST_APPROVAL and status in t.replays_from:
        # attempt 1 asked already and its answer (the token) was lost: a new token replaces it
        assert err is None, err.details()
        assert row["status"] == status and row["approval_token_hash"] != before[0]["approval_token_hash"]
        assert (await audit_actions(db, run_id))[before[1] :] == ["APPROVAL_TOKEN_REISSUED"]
        return
    assert await snapshot(s, run_id) == before  # refused or replayed: nothing changed, no audit row
    if action is Action.COMPLETE and status in t.replays_from:  # attempt 1 completed it: its repeat succeeds
        assert err is None, err.details()
        return
    # (a fail is replayed only when the audit log holds that attempt's FailRun; none was written here)
    if action in (
        Action.CLAIM,
        Action.HAND_BACK,
        Action.REAP,
        Action.EXPIRE_APPROVAL,
        Action.REDRIVE,
        Action.EXPIRE_WAIT,
    ):
        return  # a background pass (or the claim's own hand-back) simply does not pick the run
    assert err is not None, (status, action)
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, err.details()
    want = fenced_refusal(status, True, False) if t.fenced else Refusal.INVALID_TRANSITION
    assert reason_of(err) == want, (status, action, err.details())
    if want is Refusal.INVALID_TRANSITION:
        info = errors.error_info(err)
        assert info is not None and info.metadata["status"] == status


async def test_a_refused_write_of_a_reaped_lease_is_lease_lost_even_in_a_terminal_status(
    start_services: Any, channels: Any, db: Any, make_key: Any
) -> None:
    """The refusal rule's other input: the reaper took the lease, then the run ended."""
    s = await make_sched(start_services, channels, db, make_key)
    (run_id,) = await insert_runs(s.db, "p", 1)
    claimed = await s.claim_one()
    await s.db.execute(
        "UPDATE awooop_run_state SET lease_until = now() - interval '1 second' WHERE run_id = $1", uuid.UUID(run_id)
    )
    await s.db.execute("UPDATE awooop_run_state SET max_attempts = 1 WHERE run_id = $1", uuid.UUID(run_id))
    await s.reap()
    assert (await run_row(s.db, run_id))["status"] == "FAILED"
    assert fenced_refusal("FAILED", True, True) is Refusal.LEASE_LOST
    await expect_error(
        s.stub.CompleteRun(pb.CompleteRunRequest(lease=claimed.lease), metadata=s.worker),
        grpc.StatusCode.FAILED_PRECONDITION,
        errors.LEASE_LOST,
    )


# --- the table against the places that restate it -----------------------------------------


def test_the_named_sets_partition_as_declared() -> None:
    assert set(CLAIMABLE) | set(LEASED) | {RunStatus.WAITING_APPROVAL} | set(TERMINAL) == set(STATUSES)
    assert set(CANCELLABLE) == set(STATUSES) - set(TERMINAL)
    for t in TRANSITIONS.values():
        if t.action is Action.REDRIVE:  # the one way out of an end: an operator's requeue of FAILED runs
            assert t.allowed_from == (RunStatus.FAILED,)
            continue
        assert not set(t.allowed_from) & set(TERMINAL), f"{t.action} leaves a terminal status"
        # an outcome is told apart by its audit action and the status it ends in
        assert t.outcomes and len({(o.audit, o.to) for o in t.outcomes}) == len(t.outcomes), t.action


def test_the_protobuf_enum_names_every_status() -> None:
    names = {n.removeprefix("RUN_STATUS_") for n in common_pb2.RunStatus.keys()} - {"UNSPECIFIED"}
    assert names == {s.value for s in STATUSES}


async def test_the_stores_check_constraint_allows_exactly_the_statuses(db: Any) -> None:
    definition = await db.fetchval(
        """SELECT pg_get_constraintdef(c.oid) FROM pg_constraint c
            WHERE c.conrelid = 'awooop_run_state'::regclass AND c.contype = 'c'
              AND pg_get_constraintdef(c.oid) LIKE '%(status)%' """
    )
    assert set(re.findall(r"'([A-Z_]+)'", definition)) == {s.value for s in STATUSES}


def _readme_diagram() -> str:
    readme = (ROOT / "README.md").read_text()
    m = re.search(r"\*\*Runs\*\* follow the state machine.*?```\n(.*?)```", readme, re.S)
    assert m is not None, "the README's state diagram"
    return m.group(1)


def test_the_readme_diagram_shows_only_transitions_of_the_table_and_every_status() -> None:
    diagram = _readme_diagram()
    edges = {(f, to) for t in TRANSITIONS.values() for f in t.allowed_from for to in t.to_states}
    names = "|".join(sorted((s.value for s in STATUSES), key=len, reverse=True))
    drawn: set[tuple[str, str]] = set()
    for line in diagram.splitlines():
        # "A ─label─▶ B ─label─▶ C": an arrow between two named statuses; "A ⇄ B": both ways.
        # An arrow without a status on its left ("any non-terminal ─cancel─▶") is words, not an edge.
        prev, arrow = None, None
        for m in re.finditer(rf"\b({names})\b|(▶|⇄)", line):
            if m.group(2):
                arrow = m.group(2) if prev else None
                continue
            if prev and arrow:
                drawn.add((prev, m.group(1)))
                if arrow == "⇄":
                    drawn.add((m.group(1), prev))
            prev, arrow = m.group(1), None
    assert drawn, "no arrows found in the diagram"
    assert drawn <= edges, f"drawn but not in the table: {drawn - edges}"
    assert {s.value for s in STATUSES} <= set(re.findall(rf"\b({names})\b", diagram))
    # the table's edges the diagram must show (each at least once as an arrow or in words)
    for a, b in [("PENDING", "RUNNING"), ("RUNNING", "COMPLETED"), ("WAITING_APPROVAL", "RESUMED")]:
        assert (a, b) in drawn


async def test_the_partial_indexes_cover_exactly_the_named_sets(db: Any) -> None:
    """The claim and the leased-run scans are planned on partial indexes: their predicates
    must name exactly the sets the statements test, or Postgres cannot use them."""
    want = {
        "awooop_run_claim_idx": set(CLAIMABLE),
        "awooop_run_leased_idx": set(LEASED),
        "awooop_run_approval_idx": {RunStatus.WAITING_APPROVAL},
        "awooop_run_waiting_idx": {RunStatus.WAITING_TOOL},
    }
    for name, statuses in want.items():
        definition = await db.fetchval("SELECT indexdef FROM pg_indexes WHERE indexname = $1", name)
        assert definition is not None, name
        assert set(re.findall(r"'([A-Z_]+)'", definition)) == {s.value for s in statuses}, definition


def test_the_named_statements_write_only_declared_statuses_and_audit_actions() -> None:
    """The scheduler's statements (services/scheduler/*.sql) write the store's status and audit
    values as literals: each one quoted there is declared here (RunStatus or Audit). Their lists
    of statuses, like every .sql file's, are checked by tests/test_status_sets.py."""
    from services.common import runstate, sql

    declared = {s.value for s in STATUSES} | {a.value for a in runstate.Audit}
    files = sql.statement_files(ROOT / "services" / "scheduler")
    assert files
    for path in files:
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
        for literal in re.findall(r"'([A-Z][A-Z_]+)'", text):
            assert literal in declared, f"{path.name}: '{literal}' is not a declared status or audit action"


def test_the_wait_reasons_the_statements_write_are_declared_and_worded() -> None:
    """Every value a statement assigns to wait_reason (the THEN/ELSE arms of `wait_reason = CASE
    ... END`, or a plain literal) is a run_options.WaitReason, the statements write them all, and
    the CLI and console word exactly those (awooop.cli.timeline: queued reasons and parked ones)."""
    from awooop.cli import timeline
    from services.common import sql
    from services.common.run_options import WaitReason

    written: set[str] = set()
    for path in sql.statement_files(ROOT / "services"):
        text = "\n".join(line for line in path.read_text().splitlines() if not line.lstrip().startswith("--"))
        for m in re.finditer(r"\bwait_reason = (CASE\b.*?\bEND\b|'[a-z_]+')", text, re.S):
            written |= set(re.findall(r"(?:THEN|ELSE|^)\s*'([a-z_]+)'", m.group(1)))
    assert written - {r.value for r in WaitReason} == set()
    # `delayed` is written by the INSERTs that create runs (a VALUES list, not `wait_reason =`)
    assert written | {WaitReason.DELAYED.value} == {r.value for r in WaitReason}
    assert set(timeline.WAIT_REASONS) | set(timeline.PARKED) == {r.value for r in WaitReason}
