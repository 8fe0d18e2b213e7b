"""Token streams (issue 46): a run publishes high-rate partial output (ctx.stream_token,
PublishTokens) that WatchRun and the SSE stream deliver live from a Redis stream, with durable
checkpoints (stream_checkpoint rows of the run's log) instead of one row per token. A late
watcher gets the checkpoints, then the live tail; a token it cannot get live is announced as a
gap; Redis going away is announced and the watch goes on with checkpoints. Real scheduler, saga,
ingest, Postgres and Redis (an own one where it is restarted), a real SDK worker over gRPC."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
import redis.asyncio as aioredis

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import (
    AwooopError,
    Client,
    Event,
    LeaseLost,
    RunContext,
    TokenChannel,
    TokenGap,
    Tokens,
    Worker,
    to_struct,
    watch_run,
)
from services.common import embedded
from services.common.runtime import Runtime
from tests.harness.helpers import eventually, key_of
from tests.harness.scheduler import dur

PROJECT = "tokens"
OTHER = "tokens-other"


@dataclass
class Suite:
    sched: Runtime
    ingest: Runtime
    worker_key: str
    admin_key: str
    admin: Client
    worker_client: Client
    redis_url: str
    prefix: str

    @property
    def scheduler(self) -> str:
        return f"127.0.0.1:{self.sched.ports['scheduler']}"

    @property
    def saga(self) -> str:
        return f"127.0.0.1:{self.sched.ports['saga']}"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.ingest.http_ports['ingest']}"

    async def create_run(self, project: str = PROJECT, **kw: Any) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=project,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct({"ask": "stream"}),
                **kw,
            ),
        )
        return str(resp.outcomes[0].run_id)

    async def claim(self, run_id: str) -> common_pb2.LeaseToken:
        c = self.worker_client
        claimed = await c.call(
            c.scheduler.ClaimRuns, scheduler_pb2.ClaimRunsRequest(worker_id="hand", project_ids=[PROJECT], max_runs=10)
        )
        leases = [r.lease for r in claimed.runs if r.lease.run_id == run_id]
        assert leases, "the run was not claimed"
        return leases[0]

    async def publish(
        self, lease: common_pb2.LeaseToken, first: int, tokens: list[str], *, checkpoint: bool = False
    ) -> scheduler_pb2.PublishTokensResponse:
        c = self.worker_client
        request = scheduler_pb2.PublishTokensRequest(lease=lease, first_seq=first, tokens=tokens, checkpoint=checkpoint)
        return await c.call(c.scheduler.PublishTokens, request)

    def worker(self, handler: Callable[[RunContext], Awaitable[Any]], **kw: Any) -> Worker:
        return Worker(
            handler,
            projects=[PROJECT],
            key=self.worker_key,
            scheduler=self.scheduler,
            saga=self.saga,
            claim_wait=1,
            **kw,
        )


async def _suite(start_services: Any, make_key: Any, settings: Any, **overrides: Any) -> Suite:
    sched = await start_services("scheduler", "saga", reaper_interval=0.2, auth_cache_seconds=0, **overrides)
    ingest = await start_services(
        "ingest", scheduler_addr=f"127.0.0.1:{sched.ports['scheduler']}", auth_cache_seconds=0
    )
    worker_key = key_of(await make_key("tokens-worker", {PROJECT: ["worker"], OTHER: ["worker"]}, "service"))
    admin_key = key_of(await make_key("tokens-admin", {PROJECT: ["admin"], OTHER: ["admin"]}))
    addrs = {"ingest": f"127.0.0.1:{ingest.ports['ingest']}", "scheduler": f"127.0.0.1:{sched.ports['scheduler']}"}
    redis_url = overrides.get("redis_url", settings.redis_url)
    return Suite(
        sched,
        ingest,
        worker_key,
        admin_key,
        Client(key=admin_key, **addrs),
        Client(key=worker_key, **addrs),
        redis_url,
        settings.redis_prefix,
    )


@pytest.fixture
async def suite(start_services: Any, make_key: Any, settings: Any) -> AsyncIterator[Suite]:
    s = await _suite(start_services, make_key, settings, stream_checkpoint_tokens=100, stream_checkpoint_ms=60_000)
    yield s
    for c in (s.admin, s.worker_client):
        await c.close()


@dataclass
class Seen:
    """What a token watcher received."""

    items: list[Any] = field(default_factory=list)
    run: common_pb2.Run | None = None

    def batches(self) -> list[Tokens]:
        return [i for i in self.items if isinstance(i, Tokens)]

    def gaps(self) -> list[TokenGap]:
        return [i for i in self.items if isinstance(i, TokenGap)]

    def channel(self) -> list[bool]:
        return [i.live for i in self.items if isinstance(i, TokenChannel)]

    def last_seq(self) -> int:
        b = self.batches()
        return b[-1].last_seq if b else 0

    def covered(self, attempt: int = 1) -> list[int]:
        """The seqs delivered or announced as gaps, in the order they came."""
        out: list[int] = []
        for i in self.items:
            if isinstance(i, Tokens) and i.attempt == attempt:
                out.extend(range(i.first_seq, i.last_seq + 1))
            elif isinstance(i, TokenGap) and i.attempt == attempt:
                out.extend(range(i.from_seq, i.to_seq + 1))
        return out

    def tokens(self, attempt: int = 1) -> dict[int, str]:
        return {b.first_seq + k: t for b in self.batches() if b.attempt == attempt for k, t in enumerate(b.tokens)}


async def _watch(client: Client, run_id: str, seen: Seen, **kw: Any) -> Seen:
    async for item in watch_run(client, run_id, tokens=True, **kw):
        if isinstance(item, common_pb2.Run):
            seen.run = item
            return seen
        seen.items.append(item)
    raise AssertionError("the watch ended without the run")


def _checkpoints(events: list[Any], attempt: int = 1) -> list[dict[str, Any]]:
    return [
        e.data
        for e in events
        if isinstance(e, Event) and e.kind == "stream_checkpoint" and e.data["attempt"] == attempt
    ]


def _checkpointed(events: list[Any], attempt: int = 1) -> list[str]:
    """The tokens of the run's checkpoint rows, checked to follow each other without a hole."""
    out: list[str] = []
    for d in _checkpoints(events, attempt):
        assert d["first_seq"] == len(out) + 1, "checkpoints follow each other"
        out.extend(d["tokens"])
    return out


def _words(n: int, start: int = 1) -> list[str]:
    return [f"t{i} " for i in range(start, start + n)]


async def _watching(seen: Seen) -> bool:
    """The watch is live once it has delivered a row of the run's log."""
    return any(isinstance(i, Event) for i in seen.items)


# --- live delivery ----------------------------------------------------------------------------------


async def test_a_watcher_gets_every_token_live_in_order_and_the_log_holds_only_checkpoints(suite: Suite) -> None:
    """1,000 tokens streamed while a watcher follows: each token once, in order, nearly all live;
    the run's log has a handful of checkpoint rows (every 100 tokens, and the run's end) that
    together hold the whole output, and the run's output follows them."""
    started = asyncio.Event()
    go = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        started.set()
        await go.wait()
        for n, word in enumerate(_words(1000)):
            await ctx.stream_token(word)
            if n % 50 == 0:
                await asyncio.sleep(0.002)  # a model's pace, in bursts
        return {"tokens": 1000}

    task = asyncio.create_task(suite.worker(handler).run())
    try:
        run_id = await suite.create_run()
        await asyncio.wait_for(started.wait(), 30)
        seen = Seen()
        watching = asyncio.create_task(_watch(suite.admin, run_id, seen))
        await eventually(lambda: _watching(seen), what="the watch delivered the run's first rows")
        go.set()
        await asyncio.wait_for(watching, 60)
    finally:
        task.cancel()
    assert seen.run is not None and seen.run.status == common_pb2.RUN_STATUS_COMPLETED
    assert seen.covered() == list(range(1, 1001)) and not seen.gaps()
    assert "".join(seen.tokens()[i] for i in range(1, 1001)) == "".join(_words(1000))
    live = sum(len(b.tokens) for b in seen.batches() if not b.from_checkpoint)
    assert live >= 900, f"only {live} of 1000 tokens came live"
    assert all(b.produced_at is not None for b in seen.batches())
    events = [i async for i in watch_run(suite.admin, run_id) if isinstance(i, Event)]
    assert _checkpointed(events) == _words(1000)
    assert 10 <= len(_checkpoints(events)) <= 12, "a checkpoint per 100 tokens (and the rest at the end)"
    assert len([e for e in events if e.source == "progress"]) == len(_checkpoints(events)), "no row per token"


async def test_a_late_watcher_gets_the_checkpoints_then_the_live_tail_without_a_gap(suite: Suite) -> None:
    """A watcher that connects after 250 tokens (two checkpoints, 50 tokens only live) gets
    1..200 from the checkpoints, 201..250 from the live channel, then the rest live."""
    half = asyncio.Event()
    gate = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        for word in _words(250):
            await ctx.stream_token(word)
        await ctx.tokens.streams["output"].send()  # all 250 on the live channel, 2 checkpoints
        half.set()
        await gate.wait()
        for word in _words(50, 251):
            await ctx.stream_token(word)
        return {}

    task = asyncio.create_task(suite.worker(handler).run())
    try:
        run_id = await suite.create_run()
        await asyncio.wait_for(half.wait(), 30)
        seen = Seen()
        watching = asyncio.create_task(_watch(suite.admin, run_id, seen))
        await eventually(lambda: _has_seq(seen, 250), what="the tail before the gate")
        gate.set()
        await asyncio.wait_for(watching, 60)
    finally:
        task.cancel()
    assert seen.covered() == list(range(1, 301)) and not seen.gaps()
    batches = seen.batches()
    assert {b.from_checkpoint for b in batches if b.last_seq <= 200} == {True}
    assert {b.from_checkpoint for b in batches if b.first_seq > 200} == {False}
    assert [seen.tokens()[i] for i in range(1, 301)] == _words(300)


async def _has_seq(seen: Seen, seq: int) -> bool:
    return seen.last_seq() >= seq


async def test_tokens_trimmed_from_the_live_channel_are_announced_as_a_gap(suite: Suite) -> None:
    """Tokens that left the live channel before a watcher read them, and are in no checkpoint
    yet, are announced (TokenGap from..to, trimmed); the watcher gets the rest, and the
    checkpoint written later holds them all."""
    run_id = await suite.create_run()
    lease = await suite.claim(run_id)
    for first in range(1, 11, 2):
        assert (await suite.publish(lease, first, [f"w{first}", f"w{first + 1}"])).live
    rd = aioredis.from_url(suite.redis_url)
    try:
        key = f"{suite.prefix}tokens:{run_id}:output"
        assert await rd.xlen(key) == 5
        await rd.xtrim(key, maxlen=2, approximate=False)  # what MAXLEN ~ does to an old stream
    finally:
        await rd.aclose()
    seen = Seen()
    watching = asyncio.create_task(_watch(suite.admin, run_id, seen))
    await eventually(lambda: _has_seq(seen, 10), what="the retained tokens")
    assert seen.gaps() == [TokenGap("output", 1, 1, 6, "trimmed")]
    assert seen.covered() == list(range(1, 11))
    await suite.publish(lease, 1, [f"w{i}" for i in range(1, 13)], checkpoint=True)
    await eventually(lambda: _has_seq(seen, 12), what="the checkpoint's new tokens")
    c = suite.worker_client
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
    await asyncio.wait_for(watching, 30)
    assert seen.covered() == list(range(1, 13)), "each token once: delivered or announced"
    events = [i async for i in watch_run(suite.admin, run_id) if isinstance(i, Event)]
    assert _checkpointed(events) == [f"w{i}" for i in range(1, 13)]


# --- fencing and the publish protocol's crash points ---------------------------------------------


async def test_a_stale_attempt_cannot_publish_and_a_bad_batch_is_refused(suite: Suite) -> None:
    run_id = await suite.create_run()
    stale = await suite.claim(run_id)
    assert (await suite.publish(stale, 1, ["old"])).live
    c = suite.worker_client
    await c.call(c.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=stale))
    fresh = await suite.claim(run_id)
    assert fresh.attempt > stale.attempt
    with pytest.raises(LeaseLost) as caught:  # a checkpoint locks the run and checks at once
        await suite.publish(stale, 2, ["stale"], checkpoint=True)
    assert caught.value.code == grpc.StatusCode.FAILED_PRECONDITION

    async def refused() -> bool:  # the live check is trusted for AWOOOP_STREAM_LEASE_CHECK (0.5 s)
        try:
            await suite.publish(stale, 2, ["stale"])
        except LeaseLost:
            return True
        return False

    await eventually(refused, timeout=5, what="the stale attempt's live publish refused")
    assert (await suite.publish(fresh, 1, ["new"], checkpoint=True)).checkpoint_offset > 0
    with pytest.raises(AwooopError) as caught:
        await suite.publish(fresh, 0, ["x"])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(AwooopError) as caught:  # past half AWOOOP_MAX_RUN_EVENT_BYTES (64 KiB), JSON counted
        await suite.publish(fresh, 2, ["y"] * 8200, checkpoint=True)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and "tokens" in str(caught.value)
    with pytest.raises(AwooopError) as caught:  # within the batch budget, but escaped past one event's bytes
        await suite.publish(fresh, 2, ["\x01" * 800] * 30, checkpoint=True)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT and "as JSON" in str(caught.value)
    await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=fresh))
    events = [i async for i in watch_run(suite.admin, run_id) if isinstance(i, Event)]
    assert [d["tokens"] for d in _checkpoints(events, fresh.attempt)] == [["new"]]
    assert _checkpoints(events, stale.attempt) == []
    seen = await _watch(suite.admin, run_id, Seen())
    assert [(b.attempt, b.tokens) for b in seen.batches()] == [(fresh.attempt, ["new"])]


class FailPublish(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    """The n-th PublishTokens of this client fails with UNAVAILABLE at `phase`: before (never
    sent) or committed (the scheduler answered; the SDK never sees it). The SDK retries the same
    batch; `answered` needs no hook (the SDK has the answer)."""

    def __init__(self, n: int, phase: str) -> None:
        self.n, self.phase, self.count, self.fired = n, phase, 0, False

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        method = details.method.decode() if isinstance(details.method, bytes) else details.method
        if not method.endswith("/PublishTokens"):
            return await continuation(details, request)
        self.count += 1
        if self.count == self.n and self.phase == "before":
            self.fired = True
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "before")
        call = await continuation(details, request)
        if self.count == self.n and self.phase == "committed":
            await call
            self.fired = True
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "lost")
        return call


@pytest.mark.parametrize("phase", ["before", "committed", "answered"])
@pytest.mark.parametrize("n", [1, 3])
async def test_each_crash_point_of_a_publish_keeps_every_token_once(suite: Suite, phase: str, n: int) -> None:
    """PublishTokens' points: the n-th call (1: the stream's first token; 3: a later batch, a
    checkpoint with 100 tokens) lost before it was sent, lost after the scheduler committed it
    (live entry and checkpoint row written), or answered. The retried batch adds nothing twice:
    the watcher gets 1..250 once each, the log's checkpoints hold each token once."""
    hook = FailPublish(n, phase if phase != "answered" else "none")
    client = Client(key=suite.worker_key, scheduler=suite.scheduler, saga=suite.saga, interceptors=[hook])

    async def handler(ctx: RunContext) -> dict[str, Any]:
        for word in _words(250):
            await ctx.stream_token(word)
        return {}

    task = asyncio.create_task(suite.worker(handler, client=client).run())
    try:
        run_id = await suite.create_run()
        seen = await asyncio.wait_for(_watch(suite.admin, run_id, Seen()), 60)
    finally:
        task.cancel()
        await client.close()
    assert hook.fired == (phase != "answered")
    assert seen.run is not None and seen.run.status == common_pb2.RUN_STATUS_COMPLETED
    assert seen.covered() == list(range(1, 251)) and not seen.gaps()
    events = [i async for i in watch_run(suite.admin, run_id) if isinstance(i, Event)]
    assert _checkpointed(events) == _words(250)
    assert await _live_seqs(suite, run_id) == list(range(1, 251)), "the live channel holds each token once"


async def _live_seqs(suite: Suite, run_id: str) -> list[int]:
    """The seqs of the tokens on the run's live channel, in its order."""
    rd = aioredis.from_url(suite.redis_url)
    try:
        entries = await rd.xrange(f"{suite.prefix}tokens:{run_id}:output")
    finally:
        await rd.aclose()
    return [int(f[b"f"]) + k for _, f in entries for k in range(len(json.loads(f[b"x"])))]


# --- Redis going away ------------------------------------------------------------------------------


async def test_tokens_stream_through_a_redis_restart(
    start_services: Any, make_key: Any, settings: Any, tmp_path: Path
) -> None:
    """Redis stops mid-stream: the run goes on (publishing does not fail), the watcher is told
    the live channel is gone and gets the tokens with the checkpoints; Redis returns empty: the
    watcher is told and the live tail resumes. Each token is delivered or announced as missed
    once; the log's checkpoints hold them all."""
    rd = embedded.start_redis(tmp_path / "r1")
    suite = await _suite(
        start_services, make_key, settings, redis_url=rd.url, stream_checkpoint_tokens=50, stream_checkpoint_ms=60_000
    )
    phase = [asyncio.Event() for _ in range(3)]
    gate = [asyncio.Event() for _ in range(3)]
    begin = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        await begin.wait()
        for p in range(3):
            for word in _words(120, 120 * p + 1):
                await ctx.stream_token(word)
            await ctx.tokens.streams["output"].send()
            phase[p].set()
            await gate[p].wait()
        return {}

    task = asyncio.create_task(suite.worker(handler).run())
    try:
        run_id = await suite.create_run()
        seen = Seen()
        watching = asyncio.create_task(_watch(suite.admin, run_id, seen))
        await eventually(lambda: _watching(seen), what="the watch delivered the run's first rows")
        begin.set()
        await asyncio.wait_for(phase[0].wait(), 30)
        await eventually(lambda: _has_seq(seen, 120), what="phase 1 live")
        assert {b.from_checkpoint for b in seen.batches()} == {False}
        rd.stop()  # Redis goes away while the run streams on
        await eventually(lambda: _said(seen, [False]), what="the watcher told the live channel is gone")
        gate[0].set()
        await asyncio.wait_for(phase[1].wait(), 30)
        await eventually(lambda: _has_seq(seen, 200), what="phase 2 through the checkpoints")
        assert all(b.from_checkpoint for b in seen.batches() if b.first_seq > 120)
        rd = embedded.start_redis(tmp_path / "r2", port=rd.port)  # back, and empty
        await eventually(lambda: _said(seen, [False, True]), what="the watcher told the live channel is back")
        gate[1].set()
        await asyncio.wait_for(phase[2].wait(), 30)
        await eventually(lambda: _has_seq(seen, 360), what="phase 3 live again")
        gate[2].set()
        await asyncio.wait_for(watching, 30)
    finally:
        gate[2].set()
        task.cancel()
        rd.stop()
        for c in (suite.admin, suite.worker_client):
            await c.close()
    assert seen.covered() == list(range(1, 361)), "each token once: delivered or announced as missed"
    assert all(g.reason == "lost" for g in seen.gaps())
    assert any(not b.from_checkpoint for b in seen.batches() if b.first_seq > 240), "live again in phase 3"
    # the tokens after the last checkpoint before Redis returned (201..240) reach the new Redis with
    # the next checkpoint batch (it carries every token since the last one); were a live batch
    # first, they would be a gap
    assert [g.from_seq for g in seen.gaps()] in ([], [201])
    assert seen.run is not None and seen.run.status == common_pb2.RUN_STATUS_COMPLETED
    events = [i for i in seen.items if isinstance(i, Event)]
    assert _checkpointed(events) == _words(360), "the log holds every token"


async def _said(seen: Seen, states: list[bool]) -> bool:
    return seen.channel() == states


# --- over HTTP: the SSE relay ----------------------------------------------------------------------


async def _sse_tokens(
    url: str, key: str, seen: list[dict[str, Any]], *, last_id: str | None = None, stop_at: int | None = None
) -> tuple[str | None, bool]:
    """Reads the SSE stream with tokens into `seen` (token frames and events): (the last id, ended)."""
    headers = {"Authorization": f"Bearer {key}"}
    if last_id is not None:
        headers["Last-Event-ID"] = last_id
    fields: dict[str, str] = {}
    async with aiohttp.ClientSession() as s, s.get(url + "?tokens=1", headers=headers) as resp:
        assert resp.status == 200, await resp.text()
        async for raw in resp.content:
            line = raw.decode().rstrip("\n")
            if line and not line.startswith(":"):
                name, _, value = line.partition(": ")
                fields[name] = value
                continue
            if not fields:
                continue
            last_id = fields.get("id", last_id)
            seen.append({"event": fields["event"], **json.loads(fields["data"])})
            if fields["event"] == "end":
                return last_id, True
            fields = {}
            if stop_at is not None and fields == {} and _sse_last_seq(seen) >= stop_at:
                return last_id, False
    raise AssertionError("the SSE stream ended without the run")


def _sse_last_seq(seen: list[dict[str, Any]]) -> int:
    batches = [f for f in seen if f["event"] == "tokens"]
    return batches[-1]["first_seq"] + len(batches[-1]["tokens"]) - 1 if batches else 0


async def test_the_sse_stream_relays_tokens_and_resumes_after_the_last_token(suite: Suite) -> None:
    """GET /v1/runs/<id>/events?tokens=1: token frames (event tokens, id offset:attempt:seq)
    between the log's rows; a client that drops and reconnects with Last-Event-ID gets the
    tokens after the last one it had, none twice, then the end."""
    half = asyncio.Event()
    gate = asyncio.Event()

    async def handler(ctx: RunContext) -> dict[str, Any]:
        for word in _words(150):
            await ctx.stream_token(word)
        await ctx.tokens.streams["output"].send()
        half.set()
        await gate.wait()
        for word in _words(150, 151):
            await ctx.stream_token(word)
        return {"done": True}

    task = asyncio.create_task(suite.worker(handler).run())
    try:
        run_id = await suite.create_run()
        await asyncio.wait_for(half.wait(), 30)
        url = f"{suite.http}/v1/runs/{run_id}/events"
        seen: list[dict[str, Any]] = []
        last_id, ended = await _sse_tokens(url, suite.admin_key, seen, stop_at=150)
        assert not ended and last_id is not None and last_id.endswith(":1:150")
        gate.set()
        _, ended = await asyncio.wait_for(_sse_tokens(url, suite.admin_key, seen, last_id=last_id), 60)
    finally:
        task.cancel()
    assert ended and seen[-1]["event"] == "end" and seen[-1]["output"] == {"done": True}
    tokens = [t for f in seen if f["event"] == "tokens" for t in f["tokens"]]
    assert tokens == _words(300), "every token once, in order, across the reconnect"
    offsets = [f["offset"] for f in seen if f["event"] in ("state", "step", "progress")]
    assert offsets == sorted(set(offsets)), "no log row twice either"


# --- with other features ---------------------------------------------------------------------------


async def test_token_streams_across_projects_a_concurrency_key_and_a_killed_worker(suite: Suite) -> None:
    """Three runs in two projects, two of them on a concurrency key limited to one, each watched:
    the first run's first attempt streams 80 tokens and its worker dies (its lease lapses, the
    reaper takes the run back); the SDK worker then runs all three. Each watcher gets only its
    run's tokens: the dead attempt's 80, then the new attempt's from seq 1; the keyed runs one
    after the other (the reaped one may go second: its retry waits out a backoff)."""
    c = suite.admin
    await c.call(
        c.scheduler.SetConcurrencyLimit,
        scheduler_pb2.SetConcurrencyLimitRequest(project_id=PROJECT, key="llm:x", max_running=1),
    )
    first = await suite.create_run(concurrency_keys=["llm:x"])
    w = suite.worker_client
    claimed = await w.call(
        w.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(worker_id="doomed", project_ids=[PROJECT], max_runs=1, lease_ttl=dur(1)),
    )
    (doomed,) = [r.lease for r in claimed.runs]
    assert doomed.run_id == first
    dead = [f"dead{i} " for i in range(1, 81)]
    await suite.publish(doomed, 1, dead[:20])
    await suite.publish(doomed, 21, dead[20:40])
    await suite.publish(doomed, 1, dead[:60], checkpoint=True)  # a checkpoint holds all since the last one
    await suite.publish(doomed, 61, dead[60:])
    second = await suite.create_run(concurrency_keys=["llm:x"])
    other = await suite.create_run(OTHER)
    watches = {r: asyncio.create_task(_watch(suite.admin, r, Seen())) for r in (first, second, other)}
    spans: dict[str, tuple[float, float]] = {}

    async def handler(ctx: RunContext) -> dict[str, Any]:
        began = asyncio.get_running_loop().time()
        for n, word in enumerate(_words(200)):
            await ctx.stream_token(f"{ctx.run_id[:4]}:{word}")
            if n % 40 == 0:
                await asyncio.sleep(0.01)  # a model's pace: keyed runs would overlap if the key let them
        await ctx.flush_tokens()
        spans[ctx.run_id] = (began, asyncio.get_running_loop().time())
        return {"attempt": ctx.attempt}

    task = asyncio.create_task(
        Worker(
            handler,
            projects=[PROJECT, OTHER],
            key=suite.worker_key,
            scheduler=suite.scheduler,
            saga=suite.saga,
            claim_wait=1,
            concurrency=3,
        ).run()
    )
    try:
        done = {r: await asyncio.wait_for(t, 60) for r, t in watches.items()}
    finally:
        task.cancel()
    (_, a1), (b0, b1) = sorted([spans[first], spans[second]])
    assert a1 <= b0, "the keyed runs ran one after the other"
    assert spans[other][0] < max(a1, b1), "the other project's run did not wait for the key"
    for run_id, seen in done.items():
        assert seen.run is not None and seen.run.status == common_pb2.RUN_STATUS_COMPLETED
        final = seen.run.attempt_count
        assert seen.covered(final) == list(range(1, 201)) and not seen.gaps()
        assert {t.split(":")[0] for t in seen.tokens(final).values()} == {run_id[:4]}, "only its own run's tokens"
    reaped = done[first]
    assert reaped.covered(doomed.attempt) == list(range(1, 81)), "the dead attempt's tokens, then the new attempt's"
    assert list(reaped.tokens(doomed.attempt).values()) == dead
    assert [b.attempt for b in reaped.batches()] == sorted(b.attempt for b in reaped.batches())


# --- the CLI and ctx.emit ----------------------------------------------------------------------------


async def _cli(suite: Suite, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env["AWOOOP_API_KEY"] = suite.admin_key
    cmd = [sys.executable, "-m", "awooop.cli", "runs", *args, "--scheduler", suite.scheduler, "--saga", suite.saga]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=60)


async def test_runs_watch_tokens_prints_the_stream_and_an_emit_checkpoints_first(suite: Suite) -> None:
    """`awooop runs watch --tokens` prints the streamed text as it comes and the log's other rows
    on lines of their own; ctx.emit writes the tokens before it as a checkpoint first, so the
    log's order is the handler's (live or from the checkpoints, the printed text is the same)."""

    async def handler(ctx: RunContext) -> dict[str, Any]:
        for word in ["Hello", ", ", "world"]:
            await ctx.stream_token(word)
        await ctx.emit({"note": "half"}, kind="half")
        await ctx.pipe_tokens(_chunks(["!", " Bye."]))
        return {"ok": 1}

    task = asyncio.create_task(suite.worker(handler).run())
    try:
        run_id = await suite.create_run()
        text = asyncio.create_task(_cli(suite, "watch", run_id, "--tokens"))
        as_json = asyncio.create_task(_cli(suite, "watch", run_id, "--tokens", "--json"))
        done, lines = await asyncio.wait_for(text, 60), (await asyncio.wait_for(as_json, 60)).stdout.splitlines()
    finally:
        task.cancel()
    assert done.returncode == 0, done.stderr
    assert "Hello, world\n" in done.stdout and "! Bye.\n" in done.stdout
    assert "progress  half" in done.stdout and "stream_checkpoint" not in done.stdout
    frames = [json.loads(line) for line in lines]
    tokens = [t for f in frames if "tokens" in f for t in f["tokens"]["tokens"]]
    assert tokens == ["Hello", ", ", "world", "!", " Bye."]
    kinds = [f["event"]["kind"] for f in frames if "event" in f and f["event"]["source"] == "progress"]
    assert kinds == ["stream_checkpoint", "half", "stream_checkpoint"], "the emit's tokens checkpointed before it"


async def _chunks(parts: list[str]) -> AsyncIterator[str]:
    for p in parts:
        yield p


async def test_without_redis_tokens_reach_watchers_through_the_checkpoints(
    start_services: Any, make_key: Any, settings: Any
) -> None:
    """A scheduler with no Redis configured: publishing answers live=false and does not fail the
    run; a watcher is told at once that only checkpoints will come, and gets every token from them."""
    suite = await _suite(start_services, make_key, settings, redis_url="", stream_checkpoint_tokens=40)
    try:
        run_id = await suite.create_run()
        lease = await suite.claim(run_id)
        seen = Seen()
        watching = asyncio.create_task(_watch(suite.admin, run_id, seen))
        words = _words(100)
        assert not (await suite.publish(lease, 1, words[:30])).live
        assert (await suite.publish(lease, 1, words[:40], checkpoint=True)).checkpoint_offset > 0
        await eventually(lambda: _has_seq(seen, 40), what="the first checkpoint's tokens")
        await suite.publish(lease, 41, words[40:], checkpoint=True)
        c = suite.worker_client
        await c.call(c.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=lease))
        await asyncio.wait_for(watching, 30)
    finally:
        for cl in (suite.admin, suite.worker_client):
            await cl.close()
    assert seen.channel() == [False] and not seen.gaps()
    assert [seen.tokens()[i] for i in range(1, 101)] == words
    assert all(b.from_checkpoint for b in seen.batches())
