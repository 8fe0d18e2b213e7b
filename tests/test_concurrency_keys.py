"""Several concurrency keys per run (docs/flow-control.md) against the real services and store:
every limited key of a run must have room for it to start, slots are taken and given back on all
of them, a run blocked by one key is parked on it and woken when it frees, and the keys' inputs
are validated."""

from __future__ import annotations

import asyncio
import uuid
from collections import Counter
from typing import Any

import grpc
from google.protobuf import struct_pb2

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2 as pb
from awooop.scheduler.v1 import scheduler_pb2_grpc
from tests.harness.flow import Flow, LeasedPerKey, serve
from tests.harness.helpers import eventually, expect_error, settings_env, spawn_services
from tests.harness.scheduler import dur

DEPLOY = "k8s:deployment/api"
LLM = "llm:provider-x"
INVALID = grpc.StatusCode.INVALID_ARGUMENT


async def limit(f: Flow, key: str, max_running: int = 0, **kw: Any) -> None:
    req = pb.SetConcurrencyLimitRequest(project_id="p", key=key, max_running=max_running, **kw)
    await f.sched.SetConcurrencyLimit(req, metadata=f.admin)


async def get(f: Flow, run_id: str) -> common_pb2.Run:
    return (await f.sched.GetRun(pb.GetRunRequest(run_id=run_id), metadata=f.worker)).run


async def complete(f: Flow, c: pb.ClaimedRun) -> None:
    await f.sched.CompleteRun(pb.CompleteRunRequest(lease=c.lease), metadata=f.worker)


async def running(f: Flow) -> dict[str, int]:
    return {r["key"]: r["running"] for r in await f.db.fetch("SELECT key, running FROM awooop_concurrency_limit")}


async def test_a_run_blocked_by_one_of_its_keys_is_parked_on_it_and_woken_when_it_frees(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    await limit(f, DEPLOY, 1)
    await limit(f, LLM, 1)
    holder = await f.create("holder", concurrency_key=LLM)
    (h,) = await f.claim()
    assert h.run.run_id == holder.run_id
    both = await f.create("both", concurrency_keys=[LLM, DEPLOY])
    assert await f.claim() == []  # LLM is busy
    parked = await get(f, both.run_id)
    assert (parked.wait_reason, parked.wait_key) == ("key_busy", LLM)
    assert list(parked.concurrency_keys) == [DEPLOY, LLM] and parked.concurrency_key == DEPLOY
    # the parked run holds no slot on its free key: a run with that key alone starts
    assert (await running(f))[DEPLOY] == 0
    alone = await f.create("alone", concurrency_key=DEPLOY)
    (a,) = await f.claim()
    assert a.run.run_id == alone.run_id
    await complete(f, a)

    waiting = asyncio.ensure_future(f.claim(wait=dur(20)))
    await complete(f, h)  # LLM frees: the trigger wakes the run parked on it
    (c,) = await asyncio.wait_for(waiting, 30)
    assert c.run.run_id == both.run_id and c.run.wait_key == ""
    assert await running(f) == {DEPLOY: 1, LLM: 1}  # one slot on each of its keys
    await complete(f, c)
    assert await running(f) == {DEPLOY: 0, LLM: 0}  # and both given back


async def test_a_woken_run_parked_again_on_another_key_passes_the_wake_up_on(
    start_services, channels, db, make_key
) -> None:
    f = await serve(start_services, channels, db, make_key)
    await limit(f, DEPLOY, 1)
    await limit(f, LLM, 1)
    on_deploy = await f.create("on-deploy", concurrency_key=DEPLOY)
    on_llm = await f.create("on-llm", concurrency_key=LLM)
    held = {c.run.run_id: c for c in await f.claim(max_runs=2)}
    assert set(held) == {on_deploy.run_id, on_llm.run_id}
    both = await f.create("both", concurrency_keys=[DEPLOY, LLM])
    deploy_only = await f.create("deploy-only", concurrency_key=DEPLOY)
    assert await f.claim(max_runs=5) == []
    assert [(await get(f, r.run_id)).wait_key for r in (both, deploy_only)] == [DEPLOY, DEPLOY]

    await complete(f, held[on_deploy.run_id])  # wakes one run parked on DEPLOY: `both`, the oldest
    # `both` is still blocked by LLM: that claim parks it on LLM and passes DEPLOY's wake-up on
    (c,) = await f.claim(max_runs=1)
    assert c.run.run_id == deploy_only.run_id
    parked = await get(f, both.run_id)
    assert (parked.wait_reason, parked.wait_key) == ("key_busy", LLM)
    await complete(f, c)
    await complete(f, held[on_llm.run_id])
    (c,) = await f.claim()
    assert c.run.run_id == both.run_id
    await complete(f, c)
    assert await running(f) == {DEPLOY: 0, LLM: 0}


async def test_a_run_with_a_concurrency_key_and_a_rate_key_keeps_both(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    await limit(f, DEPLOY, 1)  # one at a time on the deployment
    await limit(f, LLM, max_starts=2, per=dur(1.0))  # two starts per second at the provider
    runs = [await f.create(f"r{i}", concurrency_keys=[DEPLOY, LLM]) for i in range(4)]
    seen: list[str] = []
    reasons: Counter[tuple[str, str]] = Counter()
    while len(seen) < 4:
        got = await f.claim(max_runs=4)
        for r in await db.fetch(
            "SELECT wait_reason, wait_key FROM awooop_run_state WHERE status = 'PENDING' AND not_before > now()"
        ):
            reasons[(r["wait_reason"], r["wait_key"])] += 1
        if not got:  # every run waits: for the deployment, or for the provider's next window
            got = await f.claim(max_runs=4, wait=dur(10))
        assert len(got) <= 1  # never two at once: DEPLOY's limit
        for c in got:
            seen.append(c.run.run_id)
            await complete(f, c)
    assert sorted(seen) == sorted(r.run_id for r in runs)
    assert reasons[("key_busy", DEPLOY)] > 0 and reasons[("rate_limited", LLM)] > 0, reasons
    starts = [
        r["created_at"]
        for r in await db.fetch("SELECT created_at FROM awooop_audit_log WHERE action = 'CLAIMED' ORDER BY created_at")
    ]
    # 4 starts at 2 per window: the third opens the second window, a period after the first
    assert len(starts) == 4 and (starts[2] - starts[0]).total_seconds() >= 0.9, starts
    assert await running(f) == {DEPLOY: 0, LLM: 0}


async def test_bad_keys_are_invalid_argument_and_duplicates_count_once(start_services, channels, db, make_key) -> None:
    f = await serve(start_services, channels, db, make_key)
    for fields, name in (
        ({"concurrency_keys": ["ok", "has space"]}, "concurrency_keys[1]"),
        ({"concurrency_keys": ["x" * 129]}, "concurrency_keys[0]"),
        ({"concurrency_keys": [f"k{i}" for i in range(9)]}, "at most 8 distinct keys"),
        ({"concurrency_keys": [f"k{i}" for i in range(8)], "concurrency_key": "k8"}, "at most 8 distinct keys"),
        ({"concurrency_keys": [""]}, "concurrency_keys[0]"),
    ):
        err = await expect_error(f.create(f"bad-{name}", **fields), INVALID)
        assert name in (err.details() or ""), (name, err.details())
    assert not await db.fetchval("SELECT count(*) FROM awooop_run_state")
    # a key named twice, in the list or by the old field too, counts once; the keys are sorted
    run = await f.create("dup", concurrency_keys=[LLM, DEPLOY, LLM], concurrency_key=DEPLOY)
    assert list(run.concurrency_keys) == [DEPLOY, LLM]
    eight = [f"k{i}" for i in range(8)]
    assert list((await f.create("eight", concurrency_keys=[*eight, "k0"])).concurrency_keys) == eight

    # IngestEvent takes the same fields (its batch statement passes each run's keys as one text)
    def telegram(update_id: int, keys: list[str]) -> ingest_pb2.IngestEventRequest:
        payload = struct_pb2.Struct()
        payload.update({"update_id": update_id, "message": {"text": "hi"}})
        return ingest_pb2.IngestEventRequest(
            project_id="p", channel_type=common_pb2.CHANNEL_TYPE_TELEGRAM, payload=payload, concurrency_keys=keys
        )

    resp = await f.ingest.IngestEvent(telegram(1, [LLM, DEPLOY]), metadata=f.creator)
    keys = await db.fetchval(
        "SELECT concurrency_keys FROM awooop_run_state WHERE run_id = $1", uuid.UUID(resp.outcomes[0].run_id)
    )
    assert keys == [DEPLOY, LLM]
    err = await expect_error(f.ingest.IngestEvent(telegram(2, ["a b"]), metadata=f.creator), INVALID)
    assert "concurrency_keys[0]" in (err.details() or "")


async def test_ten_claimers_on_two_scheduler_processes_never_exceed_any_key_of_multi_key_runs(
    settings, tmp_path, channels, db, db_dsn, make_key
) -> None:
    limits = {LLM: 2, DEPLOY: 1, "db:primary": 3}
    procs = [
        await spawn_services(["scheduler"], {**settings_env(settings), "AWOOOP_RETRY_JITTER": "0"}, tmp_path, f"s{i}")
        for i in range(2)
    ]
    try:
        worker = await make_key("worker", {"p": ["worker"]}, "service")
        admin = await make_key("root", {"p": ["admin"]})
        stubs = [scheduler_pb2_grpc.SchedulerServiceStub(channels(sp.ports["scheduler"])) for sp in procs]
        for key, n in limits.items():
            await stubs[0].SetConcurrencyLimit(
                pb.SetConcurrencyLimitRequest(project_id="p", key=key, max_running=n), metadata=admin
            )
        await stubs[1].SetConcurrencyLimit(
            pb.SetConcurrencyLimitRequest(project_id="p", key="llm:rated", max_starts=5, per=dur(1.0)), metadata=admin
        )
        # runs with one, two and three keys, sharing them in every combination, and some with none
        await db.execute(
            """INSERT INTO awooop_run_state (project_id, channel_type, input, concurrency_keys, created_at)
               SELECT 'p', 'api', '{}',
                      (ARRAY[NULL, '{k8s:deployment/api,llm:provider-x}', '{llm:provider-x}',
                             '{db:primary,k8s:deployment/api}', '{db:primary,llm:provider-x,llm:rated}',
                             '{k8s:deployment/api}', '{db:primary,llm:rated}'])[g % 7 + 1]::text[],
                      clock_timestamp()
                 FROM generate_series(1, 84) g"""
        )
        await db.execute("SELECT pg_notify('awooop_run_ready', 'p')")
        done = asyncio.Event()
        leased = LeasedPerKey(db_dsn, done)
        worst = leased.worst

        conflicts: list[str] = []

        async def call(rpc: Any, request: Any) -> Any:
            # a batch whose runs' triggers lock concurrency keys can lose a deadlock on every one of
            # the server's tries (db.again_on_deadlock): it answers UNAVAILABLE, "transaction
            # conflict, retry", having written nothing, and a worker calls again (the SDK does)
            while True:
                try:
                    return await rpc(request, metadata=worker)
                except grpc.aio.AioRpcError as err:
                    if err.code() != grpc.StatusCode.UNAVAILABLE or len(conflicts) >= 20:
                        raise
                    conflicts.append(err.details() or "")

        async def claimer(i: int) -> None:
            # half complete in a CompleteRuns batch, half with their next claim (ClaimRuns.complete):
            # the batch paths whose triggers give several runs' slots back in one statement
            stub = stubs[i % 2]
            carry: list[pb.CompleteRunRequest] = []
            while not done.is_set():
                resp = await call(
                    stub.ClaimRuns,
                    pb.ClaimRunsRequest(worker_id=f"w{i}", project_ids=["p"], max_runs=3, wait=dur(1), complete=carry),
                )
                carry = []
                if resp.runs:
                    await asyncio.sleep(0.01)  # the handler's work, so leases overlap
                    done_now = [pb.CompleteRunRequest(lease=c.lease) for c in resp.runs]
                    if i % 4 < 2:
                        await call(stub.CompleteRuns, pb.CompleteRunsRequest(runs=done_now))
                    else:
                        carry = done_now

        async def all_completed() -> bool:
            return not await db.fetchval("SELECT count(*) FROM awooop_run_state WHERE status <> 'COMPLETED'")

        async def all_done() -> None:
            await eventually(all_completed, timeout=120, what="every run to complete")
            done.set()

        tasks = [asyncio.ensure_future(claimer(i)) for i in range(10)] + [asyncio.ensure_future(leased.run())]
        try:
            await asyncio.wait_for(all_done(), 120)  # every parked run was woken as its keys freed
        except (AssertionError, TimeoutError) as timed_out:
            left = await db.fetch(
                """SELECT status, wait_reason, wait_key, concurrency_keys, not_before, worker_id
                     FROM awooop_run_state WHERE status <> 'COMPLETED'"""
            )
            keys = await db.fetch("SELECT key, running, max_running FROM awooop_concurrency_limit")
            failed = [t.exception() for t in tasks if t.done() and t.exception()]
            raise AssertionError(
                f"runs left {[dict(r) for r in left]}, keys {[dict(k) for k in keys]}, {failed}, retried {conflicts}"
            ) from timed_out
        finally:
            done.set()
            await asyncio.gather(*tasks, return_exceptions=True)
        for t in tasks:
            assert t.exception() is None, t.exception()
        assert all("transaction conflict" in c for c in conflicts), conflicts  # no other UNAVAILABLE
        assert all(worst[k] <= n for k, n in limits.items()), worst
        assert worst[LLM] == 2 and worst["db:primary"] >= 2, worst  # the limits were reached: it could fail
        rows = await db.fetch("SELECT key, running FROM awooop_concurrency_limit")
        assert {r["key"]: r["running"] for r in rows} == {**{k: 0 for k in limits}, "llm:rated": 0}
        starts = [
            r["created_at"]
            for r in await db.fetch(
                """SELECT a.created_at FROM awooop_audit_log a JOIN awooop_run_state r USING (run_id)
                WHERE a.action = 'CLAIMED' AND 'llm:rated' = ANY(r.concurrency_keys) ORDER BY a.created_at"""
            )
        ]
        # 24 starts at 5 per window need 5 fixed windows, each opened at least a second after the last
        assert len(starts) == 24 and (starts[-1] - starts[0]).total_seconds() >= 3.9, starts
    finally:
        for sp in procs:
            sp.terminate()
