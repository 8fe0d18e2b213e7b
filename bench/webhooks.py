"""Webhook figure: unique Gitea deliveries/s over the ingest service's HTTP endpoint
(POST /v1/webhooks/..., X-Gitea-Signature HMAC verified on every delivery) next to the same
deliveries through IngestEvent (gRPC, the Gitea channel with the X-Gitea-Delivery header).

Fairness: one server process answers both; the same load generator, processes and concurrency
drive both, in interleaved rounds (gRPC, HTTP, gRPC, ...), and each figure is the median round.
Both paths store the same rows (a dedupe row, a run, an audit row per delivery). The client
signs each HTTP body (client CPU, on the same cores): the server's check is what is measured.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import os
import secrets
from typing import Any

from bench import cpu, env, procs, rss
from bench.config import Config
from bench.loadgen import LoadResult, Unexpected, run_load
from bench.report import Figure
from services.common.embedded import free_port

PROJECT = "bench"
ENDPOINT = "bench-repo"
BODY: dict[str, Any] = {
    "ref": "refs/heads/main",
    "after": "bffeb74224043ba2feb48d137756c8a9331c449a",
    "pusher": {"login": "gitea"},
}


class GrpcGitea:
    """IngestEvent, channel GITEA, a fresh X-Gitea-Delivery per call."""

    def __init__(self, address: str, metadata: list[list[str]], label: str) -> None:
        self.address, self.metadata, self.label = address, tuple(tuple(m) for m in metadata), label

    async def setup(self, proc_idx: int, workers: int) -> None:
        import grpc
        from google.protobuf import struct_pb2

        from awooop.common.v1 import common_pb2
        from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc

        self.proc_idx = proc_idx
        self.channel = grpc.aio.insecure_channel(self.address)
        await self.channel.channel_ready()
        self.stub = ingest_pb2_grpc.IngestServiceStub(self.channel)
        payload = struct_pb2.Struct()
        payload.update(BODY)
        self.pb = ingest_pb2
        self.template = ingest_pb2.IngestEventRequest(
            project_id=PROJECT, channel_type=common_pb2.CHANNEL_TYPE_GITEA, payload=payload, endpoint=ENDPOINT
        )

    async def call(self, worker: int, n: int) -> int:
        r = self.pb.IngestEventRequest()
        r.CopyFrom(self.template)
        r.headers["X-Gitea-Delivery"] = f"{self.label}-{self.proc_idx}-{worker}-{n}"
        r.headers["X-Gitea-Event"] = "push"
        out = await self.stub.IngestEvent(r, metadata=self.metadata, timeout=30)
        if out.outcomes[0].duplicate:
            raise Unexpected("a fresh delivery was answered as a duplicate")
        return 1

    async def close(self) -> None:
        await self.channel.close()


class HttpGitea:
    """POST /v1/webhooks/{project}/gitea/{endpoint}, signed as Gitea signs, a fresh delivery id per call."""

    def __init__(self, url: str, secret: str, label: str) -> None:
        self.url, self.secret, self.label = url, secret.encode(), label
        self.body = json.dumps(BODY).encode()

    async def setup(self, proc_idx: int, workers: int) -> None:
        import aiohttp

        self.proc_idx = proc_idx
        self.http = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=max(1, workers)))
        self.signature = hmac.new(self.secret, self.body, hashlib.sha256).hexdigest()

    async def call(self, worker: int, n: int) -> int:
        headers = {
            "Content-Type": "application/json",
            "X-Gitea-Event": "push",
            "X-Gitea-Delivery": f"{self.label}-{self.proc_idx}-{worker}-{n}",
            "X-Gitea-Signature": self.signature,
        }
        async with self.http.post(self.url, data=self.body, headers=headers) as r:
            doc = await r.json(content_type=None)
            if r.status != 200:
                raise Unexpected(f"HTTP {r.status}: {doc}")
        if doc["outcomes"][0]["duplicate"]:
            raise Unexpected("a fresh delivery was answered as a duplicate")
        return 1

    async def close(self) -> None:
        await self.http.close()


def declare(cfg: Config) -> list[Figure]:
    return [
        Figure(
            "webhook_http",
            "unique events/s, HTTP webhook (Gitea, HMAC verified)",
            "events/s",
            "ratio_ge",
            0.7,
            "≥ 0.7 ×",
            baseline_label=f"IngestEvent events/s (Gitea), same server and client, {cfg.table_concurrency} in flight",
            baseline_unit="events/s",
        )
    ]


async def _load(kind: str, params: dict[str, Any], cfg: Config, svc: procs.Service) -> LoadResult:
    return await asyncio.to_thread(
        run_load,
        f"bench.webhooks:{kind}",
        params,
        concurrency=cfg.table_concurrency,
        processes=cfg.processes,
        duration=cfg.duration,
        warmup=cfg.warmup,
        server_pid=svc.pid,
    )


def _median(results: list[LoadResult]) -> LoadResult:
    return sorted(results, key=lambda r: r.units_per_s)[len(results) // 2]


async def _endpoint(dsn: str, secret: str) -> None:
    import asyncpg

    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """INSERT INTO awooop_channel_endpoint (project_id, channel_type, name, secret, created_by)
               VALUES ($1, 'gitea', $2, $3, 'bench')""",
            PROJECT,
            ENDPOINT,
            secret,
        )
    finally:
        await conn.close()


async def run(stores: env.Stores, cfg: Config, figures: list[Figure]) -> list[Figure]:
    (fig,) = figures
    label = secrets.token_hex(3)
    dsn = await stores.create_database("webhooks")
    http_port = free_port()
    svc = await procs.spawn(
        "ingest", procs.service_env(dsn, stores.redis_url, stores.redis_prefix + "w:", http_port=http_port)
    )
    try:
        secret = secrets.token_urlsafe(32)
        await _endpoint(dsn, secret)
        md = await env.bench_key(dsn, PROJECT, ("ingest",))
        grpc_params = {"address": svc.address, "metadata": [list(m) for m in md]}
        http_params = {"url": f"http://127.0.0.1:{http_port}/v1/webhooks/{PROJECT}/gitea/{ENDPOINT}", "secret": secret}
        got: dict[str, list[LoadResult]] = {"grpc": [], "http": []}
        for r in range(cfg.table_rounds):
            got["grpc"].append(await _load("GrpcGitea", {**grpc_params, "label": f"{label}-g{r}"}, cfg, svc))
            got["http"].append(await _load("HttpGitea", {**http_params, "label": f"{label}-h{r}"}, cfg, svc))
        g, h = _median(got["grpc"]), _median(got["http"])
        rounds = {k: [round(x.units_per_s, 1) for x in v] for k, v in got.items()}
        fig.measured(h.units_per_s, g.units_per_s, run=h.as_dict(), grpc=g.as_dict(), rounds=rounds)
        fig.details["bound"] = cpu.bound(h.cpu, os.cpu_count() or 1)
        bad = [x for x in (g, h) if x.errors or x.unexpected]
        if bad:
            fig.note = f"{sum(sum(x.errors.values()) for x in bad)} errors: {bad[0].first_error}"
        rss.record("ingest", svc, "after the webhook rounds (HTTP + gRPC)")
    finally:
        svc.stop()
    return figures
