"""OpenTelemetry: one trace per run, from the caller's IngestEvent through the claim, the worker
SDK's steps, the approval's rejection and the saga's compensation with its gateway call; the
trace context is stored with the run and handed to the worker with its claim. Real services
and channels, spans captured by the SDK's in-memory exporter; with tracing off nothing is
traced and no traceparent is stored."""

from __future__ import annotations

import asyncio
import io
import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp
import asyncpg
import grpc
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import Child, Client, RunContext, Worker, to_struct
from services.common import tracing
from services.common.observability import JsonFormatter
from tests.harness.helpers import eventually, key_of, start_with_gateway

PROJECT = "traced"
ABORT = f"{grpc.aio.AbortError.__module__}.{grpc.aio.AbortError.__qualname__}"  # as record_exception names it


@pytest.fixture
def exporter() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    tracing.configure(provider)
    yield provider, memory
    tracing.configure(None)


@pytest.fixture
def rpc_log() -> Iterator[io.StringIO]:
    """The awooop.rpc access log (written at DEBUG) as JSON lines."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("awooop.rpc")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.DEBUG)
    yield out
    logger.removeHandler(handler)
    logger.setLevel(level)


async def services(
    start_services: Any, make_key: Any, db: asyncpg.Connection, project: str = PROJECT, **kw: Any
) -> dict[str, Any]:
    """The services, a deployment for the scale step, and keys for project."""
    gw, rt = await start_with_gateway(start_services, {"access_log": True}, auth_cache_seconds=0, access_log=True, **kw)
    await db.execute(
        "INSERT INTO awooop_refgw_deployment (project_id, name, replicas) VALUES ($1, 'api', 2) ON CONFLICT DO NOTHING",
        project,
    )
    tag = uuid.uuid4().hex[:6]
    return {
        "runtimes": [gw, rt],
        "project": project,
        "ingest": f"127.0.0.1:{rt.ports['ingest']}",
        "scheduler": f"127.0.0.1:{rt.ports['scheduler']}",
        "saga": f"127.0.0.1:{rt.ports['saga']}",
        "worker_key": key_of(await make_key(f"worker-{tag}", {project: ["worker"]}, "service")),
        "admin": await make_key(f"admin-{tag}", {project: ["admin"]}),
    }


async def reject_and_compensate(addr: dict[str, Any], provider: Any, db: asyncpg.Connection, md: Any) -> str:
    """IngestEvent with the caller's metadata md; a worker journals two steps and asks for
    approval; the approver rejects; the saga compensates the scale. Returns the run id."""
    async with grpc.aio.insecure_channel(addr["ingest"]) as ch:
        resp = await ingest_pb2_grpc.IngestServiceStub(ch).IngestEvent(
            ingest_pb2.IngestEventRequest(
                project_id=addr["project"],
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=uuid.uuid4().hex,
                payload=to_struct({"alert": "cpu"}),
            ),
            metadata=(*addr["admin"], *md),
        )
    run_id = resp.outcomes[0].run_id
    tokens: asyncio.Queue[str] = asyncio.Queue()

    async def handler(ctx: RunContext) -> None:
        await ctx.step("diagnose", lambda call: {"text": "too few pods"}, step_type="llm_call")
        await ctx.step(
            "scale",
            lambda call: {"previous_replicas": 2},
            tool_id="k8s_scale_deployment",
            params={"deployment": "api", "replicas": 5},
            compensation={"tool_id": "k8s_scale_deployment", "params": {"deployment": "api", "replicas": 2}},
        )
        approval = await ctx.request_approval("keep 5 replicas?")
        if not approval.granted:
            await tokens.put(approval.token)

    worker = Worker(
        handler,
        projects=[addr["project"]],
        key=addr["worker_key"],
        scheduler=addr["scheduler"],
        saga=addr["saga"],
        claim_wait=1,
        tracer_provider=provider,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    admin = Client(key=key_of(addr["admin"]), scheduler=addr["scheduler"])  # the approver: not traced
    try:
        token = await asyncio.wait_for(tokens.get(), 20)
        await admin.call(
            admin.scheduler.DecideApproval,
            scheduler_pb2.DecideApprovalRequest(
                run_id=run_id, approval_token=token, decision=scheduler_pb2.DECISION_REJECT, reason="no"
            ),
        )

        async def compensated() -> bool:
            status = await db.fetchval("SELECT saga_status FROM awooop_run_state WHERE run_id = $1", run_id)
            return bool(status == "compensated")

        await eventually(compensated, timeout=30, what="the compensation")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await admin.close()
    return run_id


async def test_one_trace_from_ingest_through_claim_steps_rejection_and_compensation(
    start_services: Any, make_key: Any, db: asyncpg.Connection, exporter: Any, rpc_log: io.StringIO
) -> None:
    provider, memory = exporter
    addr = await services(start_services, make_key, db)
    # the caller's own trace: its traceparent arrives as gRPC metadata
    with provider.get_tracer("test").start_as_current_span("alert received") as root:
        carrier: dict[str, str] = {}
        TraceContextTextMapPropagator().inject(carrier)
    trace_id = root.get_span_context().trace_id
    run_id = await reject_and_compensate(addr, provider, db, tuple(carrier.items()))

    stored = await db.fetchval("SELECT traceparent FROM awooop_run_state WHERE run_id = $1", run_id)
    assert stored.startswith(f"00-{trace_id:032x}-")

    async def compensation_spans() -> list[ReadableSpan]:
        spans = memory.get_finished_spans()
        return [s for s in spans if s.name == "awooop.saga.compensate"] and list(spans)

    spans = await eventually(compensation_spans, what="the compensation span to end")
    ours = [s for s in spans if s.context.trace_id == trace_id]
    by_id = {s.context.span_id: s for s in ours}
    names = [s.name for s in ours]

    def one(name: str, kind: trace.SpanKind = trace.SpanKind.INTERNAL, **attrs: Any) -> ReadableSpan:
        found = [
            s
            for s in ours
            if s.name == name and s.kind == kind and all(s.attributes.get(k) == v for k, v in attrs.items())
        ]
        assert len(found) == 1, (name, attrs, names)
        return found[0]

    server = trace.SpanKind.SERVER

    def parent(s: ReadableSpan) -> ReadableSpan:
        assert s.parent is not None and s.parent.span_id in by_id, (s.name, names)
        return by_id[s.parent.span_id]

    def ancestors(s: ReadableSpan) -> list[str]:
        out = []
        while s.parent is not None and s.parent.span_id in by_id:
            s = by_id[s.parent.span_id]
            out.append(s.name)
        return out

    ingest = one("/awooop.ingest.v1.IngestService/IngestEvent", server)
    assert ingest.parent is not None and ingest.parent.span_id == root.get_span_context().span_id
    assert stored.startswith(f"00-{trace_id:032x}-{ingest.context.span_id:016x}-")  # the run's trace continues it
    # the claim (recorded by the worker from the scheduler's claimable_since): one per attempt
    claims = [s for s in ours if s.name == "awooop.run.claim"]
    assert len(claims) == 1 and parent(claims[0]) is ingest
    claim = claims[0]
    assert claim.start_time <= ingest.end_time + 10**9  # it spans the queue wait, from the run's creation
    runs = [s for s in ours if s.name == "awooop.worker.run"]
    assert runs and all(parent(r) is claim for r in runs)
    for step_id in ("diagnose", "scale"):
        step = one("awooop.worker.step", **{"awooop.step_id": step_id})
        assert parent(step).name == "awooop.worker.run"
    approval = one("awooop.worker.approval")
    assert approval.attributes["awooop.approved"] is False
    # the worker's journal writes reach the saga in the same trace, under their step
    journaled = [s for s in ours if s.name.startswith("/awooop.saga.v1.SagaService/") and s.kind == server]
    assert {"/awooop.saga.v1.SagaService/RecordStep", "/awooop.saga.v1.SagaService/BeginStep"} <= {
        s.name for s in journaled
    }
    assert all("awooop.worker.run" in ancestors(s) for s in journaled)
    decided = one("awooop.run.approval_decided")
    assert parent(decided) is ingest and decided.attributes["awooop.approved"] is False
    compensate = one("awooop.saga.compensate")
    assert parent(compensate) is ingest
    undo = one("awooop.saga.compensate_step", **{"awooop.step_id": "scale"})
    assert parent(undo) is compensate and undo.attributes["awooop.outcome"] == "compensated"
    gateway = one("/awooop.tools.v1.ToolGatewayService/ExecuteTool", server)
    assert "awooop.saga.compensate_step" in ancestors(gateway)

    # logs carry the run and the trace
    lines = [json.loads(line) for line in rpc_log.getvalue().splitlines()]
    begin = [r for r in lines if r.get("method") == "/awooop.saga.v1.SagaService/BeginStep"]
    assert begin and all(r["run_id"] == run_id and r["trace_id"] == f"{trace_id:032x}" for r in begin)


async def test_a_parent_s_children_run_in_its_trace_under_the_call_that_started_them(
    start_services: Any, make_key: Any, db: asyncpg.Connection, exporter: Any
) -> None:
    """A parent fans out children through the SDK (start_child, run_children, handle.result):
    every span of a child (its claim, its handler's run and step spans, the saga's server spans
    of its journal writes) is in the parent's trace, under the scheduler's server span of the
    StartChildRuns that started it, under the parent's SDK span of that call. Batched
    completions (one call for many runs) hang under no run."""
    provider, memory = exporter
    addr = await services(start_services, make_key, db, project="traced-tree")

    async def handler(ctx: RunContext) -> dict[str, Any]:
        if ctx.input.get("role") == "child":
            await ctx.step("work", lambda call: {"n": ctx.input["n"]}, step_type="llm_call")
            return {"n": ctx.input["n"]}
        solo = await ctx.start_child({"role": "child", "n": 0}, step_id="solo")
        kids = await ctx.run_children(
            [Child({"role": "child", "n": n}, step_id=f"kid{n}") for n in (1, 2)], step_id="kids"
        )
        last = await solo.result()
        return {"ns": [o.output["n"] for o in (last, *kids)]}

    async with grpc.aio.insecure_channel(addr["ingest"]) as ch:
        resp = await ingest_pb2_grpc.IngestServiceStub(ch).IngestEvent(
            ingest_pb2.IngestEventRequest(
                project_id=addr["project"],
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=uuid.uuid4().hex,
                payload=to_struct({"role": "parent"}),
            ),
            metadata=addr["admin"],
        )
    parent_id = resp.outcomes[0].run_id
    worker = Worker(
        handler,
        projects=[addr["project"]],
        key=addr["worker_key"],
        scheduler=addr["scheduler"],
        saga=addr["saga"],
        claim_wait=1,
        concurrency=4,
        tracer_provider=provider,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def parent_done() -> bool:
            status = await db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent_id))
            return bool(status == "COMPLETED")

        await eventually(parent_done, timeout=30, what="the parent completed")
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
    out = await db.fetchval("SELECT output FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent_id))
    assert json.loads(out) == {"ns": [0, 1, 2]}
    kids = {
        r["parent_step_id"]: str(r["run_id"])
        for r in await db.fetch(
            "SELECT run_id, parent_step_id FROM awooop_run_state WHERE parent_run_id = $1", uuid.UUID(parent_id)
        )
    }
    assert set(kids) == {"solo", "kid1", "kid2"}
    trace_id = int(
        (await db.fetchval("SELECT traceparent FROM awooop_run_state WHERE run_id = $1", uuid.UUID(parent_id))).split(
            "-"
        )[1],
        16,
    )

    saga_calls = "/awooop.saga.v1.SagaService/"

    async def ended() -> list[ReadableSpan]:  # server spans end as their answer is sent
        spans = list(memory.get_finished_spans())
        journaled = [s for s in spans if s.name.startswith(saga_calls) and s.kind == trace.SpanKind.SERVER]
        return spans if len(journaled) >= 3 else []

    spans = await eventually(ended, what="the children's journal calls' server spans")
    by_id = {s.context.span_id: s for s in spans}
    names = sorted({s.name for s in spans})

    def chain(s: ReadableSpan) -> list[ReadableSpan]:
        """s's ancestors, nearest first."""
        out = []
        while s.parent is not None and s.parent.span_id in by_id:
            s = by_id[s.parent.span_id]
            out.append(s)
        return out

    def attr(s: ReadableSpan, name: str) -> Any:
        return (s.attributes or {}).get(name)

    def run_spans(run_id: str) -> list[ReadableSpan]:
        return [s for s in spans if s.name == "awooop.worker.run" and attr(s, "awooop.run_id") == run_id]

    # a batch of completions is no one run's call: none hangs under a run (the batcher's task
    # outlives the run that started it)
    batched = [s for s in spans if s.name.endswith("/CompleteRuns")]
    assert batched and not [s for s in batched if any(a.name == "awooop.worker.run" for a in chain(s))]
    parent_runs = run_spans(parent_id)
    assert len(parent_runs) >= 2, names  # claimed, parked on its children, claimed again (and maybe again)
    assert {s.context.trace_id for s in parent_runs} == {trace_id}
    parent_span_ids = {s.context.span_id for s in parent_runs}
    # the parent's SDK span of each call that starts children
    sdk = {
        "solo": ("awooop.worker.start_child", "solo"),
        "kid1": ("awooop.worker.run_children", "kids"),
        "kid2": ("awooop.worker.run_children", "kids"),
    }
    for step_id, run_id in kids.items():
        [child_run] = run_spans(run_id)  # one attempt
        assert child_run.context.trace_id == trace_id, step_id
        up = chain(child_run)
        assert [s.name for s in up[:2]] == ["awooop.run.claim", "/awooop.scheduler.v1.SchedulerService/StartChildRuns"]
        assert up[1].kind == trace.SpanKind.SERVER
        name, sdk_step = sdk[step_id]
        started_by = [s for s in up if s.name == name]
        assert len(started_by) == 1 and attr(started_by[0], "awooop.step_id") == sdk_step, [s.name for s in up]
        # the SDK's span is the parent's, within one of its runs
        assert chain(started_by[0])[0].context.span_id in parent_span_ids
        # the child's step, and the saga's server span of its journal write, hang under the child's run
        [step] = [s for s in spans if s.name == "awooop.worker.step" and chain(s)[:1] == [child_run]]
        assert attr(step, "awooop.step_id") == "work" and step.context.trace_id == trace_id
        journaled = [s for s in spans if s.name.startswith(saga_calls) and child_run in chain(s)]
        assert any(s.kind == trace.SpanKind.SERVER for s in journaled), [s.name for s in journaled]
        assert {s.context.trace_id for s in journaled} == {trace_id}


async def test_without_a_traceparent_the_run_starts_a_trace_and_off_stores_none(
    start_services: Any, make_key: Any, db: asyncpg.Connection, exporter: Any
) -> None:
    provider, memory = exporter
    addr = await services(start_services, make_key, db)
    run_id = await reject_and_compensate(addr, provider, db, ())
    stored = await db.fetchval("SELECT traceparent FROM awooop_run_state WHERE run_id = $1", run_id)
    ingest = [
        s
        for s in memory.get_finished_spans()
        if s.name == "/awooop.ingest.v1.IngestService/IngestEvent" and s.kind == trace.SpanKind.SERVER
    ]
    assert len(ingest) == 1 and ingest[0].parent is None  # a new trace
    assert stored.startswith(f"00-{ingest[0].context.trace_id:032x}-{ingest[0].context.span_id:016x}-")

    # tracing off: no span, nothing stored, the claim hands out no traceparent (the traced
    # servers stop first: their interceptors would still trace a late long-poll)
    for rt in addr["runtimes"]:
        await rt.stop(0.2)
    tracing.configure(None)
    memory.clear()
    # (another project: a long-poll of the first worker may still be waiting on the server)
    off = await services(start_services, make_key, db, project="untraced")
    off_run = await reject_and_compensate(off, None, db, ())
    assert await db.fetchval("SELECT traceparent FROM awooop_run_state WHERE run_id = $1", off_run) is None
    assert memory.get_finished_spans() == ()


def test_tracing_is_on_only_when_the_otel_variables_say_so() -> None:
    assert not tracing.env_enabled({})
    assert tracing.env_enabled({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4317"})
    assert tracing.env_enabled({"OTEL_TRACES_EXPORTER": "otlp"})
    assert not tracing.env_enabled({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"})
    assert not tracing.env_enabled({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"})


async def test_the_otel_variables_turn_tracing_on_in_a_served_process_and_spans_reach_the_otlp_endpoint(
    settings: Any, tmp_path: Any
) -> None:
    """`awooop serve ingest` with OTEL_EXPORTER_OTLP_ENDPOINT: its spans are exported over
    OTLP/gRPC (a receiver built on the OTLP protos) and flushed at SIGTERM."""
    import os
    import subprocess
    import sys

    from bench.otlp_sink import Sink
    from services.common.embedded import free_port
    from tests.harness.helpers import ROOT, settings_env, wait_healthy

    sink = Sink(keep=True).start()
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWOOOP_", "OTEL_"))}
    env.update(settings_env(settings.with_(ingest_port=port, metrics_port=0)))
    env.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.endpoint,
            "OTEL_EXPORTER_OTLP_INSECURE": "true",
            "OTEL_SERVICE_NAME": "ingest-under-test",
        }
    )
    log = tmp_path / "ingest.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "awooop.cli", "serve", "ingest"], env=env, cwd=ROOT, stderr=out)
    try:
        await wait_healthy(port)
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as ch:
            with pytest.raises(grpc.aio.AioRpcError):  # no key: UNAUTHENTICATED, traced all the same
                await ingest_pb2_grpc.IngestServiceStub(ch).CreateRun(ingest_pb2.CreateRunRequest(project_id="p"))
        proc.terminate()
        assert await asyncio.to_thread(proc.wait, 30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
        sink.stop()
    kept = sink.counter.kept
    assert kept, log.read_text()
    assert {resource.get("service.name") for resource, _ in kept} == {"ingest-under-test"}
    names = [name for _, name in kept]
    assert "/awooop.ingest.v1.IngestService/CreateRun" in names
    assert not [n for n in names if n.startswith("/grpc.health")]  # wait_healthy's checks are not traced


async def test_a_webhook_traceparent_header_continues_the_senders_trace(
    start_services: Any, make_key: Any, db: asyncpg.Connection, exporter: Any
) -> None:
    _, memory = exporter
    rt = await start_services("ingest")
    md = dict(await make_key("hook", {PROJECT: ["ingest"]}))
    sender_trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    headers = {
        "Authorization": md["authorization"],
        "Idempotency-Key": "traced-1",
        "traceparent": f"00-{sender_trace}-00f067aa0ba902b7-01",
    }
    url = f"http://127.0.0.1:{rt.http_ports['ingest']}/v1/projects/{PROJECT}/events"
    async with aiohttp.ClientSession() as http, http.post(url, data=b'{"ask": "scale"}', headers=headers) as r:
        assert r.status == 200, await r.text()
        run_id = (await r.json())["outcomes"][0]["run_id"]
    stored = await db.fetchval("SELECT traceparent FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
    assert stored is not None and stored.split("-")[1] == sender_trace  # the run joined the sender's trace
    spans = [s for s in memory.get_finished_spans() if s.name == "POST /v1/events"]
    assert len(spans) == 1 and f"{spans[0].context.trace_id:032x}" == sender_trace
    assert stored.split("-")[2] == f"{spans[0].context.span_id:016x}"  # stored under the HTTP span


async def test_a_refused_rpc_s_server_span_carries_the_code_it_was_answered_with(
    start_services: Any, make_key: Any, db: asyncpg.Connection, exporter: Any
) -> None:
    _, memory = exporter
    addr = await services(start_services, make_key, db, project="refused")
    async with grpc.aio.insecure_channel(addr["ingest"]) as ch:
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        bad = ingest_pb2.IngestEventRequest(project_id=addr["project"], provider_event_id="x")  # no channel
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.IngestEvent(bad, metadata=addr["admin"])
        with pytest.raises(grpc.aio.AioRpcError) as anonymous:
            await stub.IngestEvent(bad)
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert anonymous.value.code() == grpc.StatusCode.UNAUTHENTICATED

    async def ended() -> list[ReadableSpan]:  # the span ends as grpc's abort returns: after the answer
        name = "/awooop.ingest.v1.IngestService/IngestEvent"
        spans = [s for s in memory.get_finished_spans() if s.name == name]
        return spans if len(spans) == 2 else []

    spans = await eventually(ended, what="both calls' server spans")
    assert [s.attributes["rpc.grpc.status_code"] for s in spans if s.attributes] == [3, 16]
    assert all(s.status.status_code is trace.StatusCode.UNSET for s in spans)  # the caller's mistake
    # the instrumentation records grpc's AbortError, which ends every refused call, as an
    # exception; nothing else is (an answered refusal is no bug)
    assert all({e.attributes["exception.type"] for e in s.events if e.attributes} <= {ABORT} for s in spans)


def test_with_tracing_off_no_server_interceptor_is_installed() -> None:
    tracing.configure(None)
    assert tracing.server_interceptors() == [] and tracing.client_interceptors() == []


def test_the_sampler_is_the_standard_variables(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_TRACES_EXPORTER", "console")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER", "parentbased_traceidratio")
    monkeypatch.setenv("OTEL_TRACES_SAMPLER_ARG", "0.1")
    tracing.configure(None)
    assert tracing.configure_from_env("awooop-test")
    try:
        assert tracing.provider.sampler.get_description().startswith("ParentBased{root:TraceIdRatioBased{0.1}")
        assert len(tracing.server_interceptors()) == 1
    finally:
        tracing.shutdown()
    assert tracing.provider is None


def test_services_and_the_sdk_import_no_library_s_private_module() -> None:
    """Only public APIs of libraries: no `import x._y` / `from x._y import` (a private module
    changes without notice between releases)."""
    import ast

    from tests.harness.helpers import ROOT

    found = []
    for tree in ("services", "packages/worker/src/awooop/worker", "packages/worker/src/awooop/cli"):
        for path in sorted((ROOT / tree).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module]
                for name in names:
                    if not name.startswith(("services", "awooop")) and any(
                        part.startswith("_") and part != "__future__" for part in name.split(".")
                    ):
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not found, found
