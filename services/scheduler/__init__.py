"""The scheduler service: hands runs to worker pods under fenced leases (seed 000 D2–D5,
docs/architecture.md "State machine, leases and fencing").

Modules, transport first:
    servicer.py     SchedulerService transport: each RPC handed to its group's module below
    claim_rpcs.py, worker_write_rpcs.py, approval_rpcs.py, wait_rpcs.py, child_rpcs.py,
    read_rpcs.py, flow_rpcs.py, schedule_rpcs.py, watch_rpcs.py
                    the RPC groups (claims and leases; fenced worker writes; approvals and cancel;
                    durable waits; child runs; run reads; project flow, limits, pause, redrive;
                    schedules; watching runs): validate, call the logic, build responses
    rpc_fields.py   request fields and answer parts several groups share (a lease token, a status)
    claiming.py     the ClaimRuns long-poll (wake-up, a backoff's end, or the wait's end) around the claim
    batch_complete.py  CompleteRuns, and the claim that carries completions
    hand_back.py    handing back claimed runs the call does not deliver (no room, caller gone, error)
    leases.py       the heartbeat (lease renewal)
    transitions.py  fenced worker writes (complete, fail, release, tool waits, cancel ack) and CancelRun
    approvals.py    RequestApproval / DecideApproval and the approval expiry sweep
    reaper.py       the stale-lease reaper pass
    reads.py        GetRun, ListRuns (keyset page tokens), GetRunHistory
    refusals.py     the choice of error when a fenced write changed nothing
    wakeup.py       the LISTEN connection that wakes long-polling claims
    saga_client.py  fire-and-forget SagaService.Compensate after a compensation request was recorded
    metrics.py      Prometheus metrics (awooop_scheduler_*)
    app.py          wiring: servicer, LISTEN loop, reaper loop, approval sweep loop

The statements they run are named, whole, in the .sql files beside them (services/common/sql.py):
claims.sql (the claim, CompleteRuns, the hand-back), fenced_writes.sql, approvals.sql, reaper.sql,
leases.sql, concurrency.sql, replays.sql.

Shared with the other services: the run state machine (services/common/runstate.py) and the
access policy (services/common/access.py).
"""
