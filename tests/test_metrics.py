"""Metrics an operator can alert on: the queue gauges and claim-wait histogram per project, the
standard grpc_server_* metrics, every labelled series at 0 from start-up, no `_created` series,
only a process's own metrics on its endpoint (scraped from real `awooop serve` processes and
linted by `promtool check metrics`), and a real Prometheus with the shipped rules firing on the
first compensation failure and on a run nobody claims.

Written for Prometheus and promtool 2.42 (Debian 12, .ci/install-debian prints the version): the
lint rules of `promtool check metrics` and the rule-file format of that release."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.parse
import urllib.request
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import grpc
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2, ingest_pb2_grpc
from awooop.scheduler.v1 import scheduler_pb2, scheduler_pb2_grpc
from awooop.worker import RunContext, Worker, to_struct
from services.common.embedded import free_port
from services.common.settings import Settings
from services.scheduler import metrics as sched_metrics
from tests.harness.helpers import ROOT, eventually, internal_key, settings_env, wait_healthy

ALERTS = ROOT / "deploy" / "prometheus" / "alerts.yml"


def need(program: str) -> str:
    """The program's path; in CI a missing program fails the test (.ci/install-debian)."""
    path = shutil.which(program)
    if path is None:
        if os.environ.get("CI") == "true":
            pytest.fail(f"{program} is not installed (.ci/install-debian installs it)")
        pytest.skip(f"{program} not installed (.ci/install-debian)")
    return path


def gauge(name: str, **labels: str) -> float | None:
    return REGISTRY.get_sample_value(name, labels)


def api_event(project: str) -> ingest_pb2.IngestEventRequest:
    return ingest_pb2.IngestEventRequest(
        project_id=project,
        channel_type=common_pb2.CHANNEL_TYPE_API,
        provider_event_id=uuid.uuid4().hex,
        payload=to_struct({"n": 1}),
    )


# ---------------------------------------------------------------- queue gauges and claim wait


async def test_queue_gauges_count_runs_by_project_and_status_and_claims_observe_the_wait(
    start_services: Any, channels: Any, make_key: Any, db: asyncpg.Connection
) -> None:
    project = f"q-{uuid.uuid4().hex[:8]}"
    rt = await start_services("ingest", "scheduler", queue_metrics_interval=0.1)
    md = await make_key("queue-admin", {project: ["admin"]})
    ingest = ingest_pb2_grpc.IngestServiceStub(channels(rt.ports["ingest"]))
    sched = scheduler_pb2_grpc.SchedulerServiceStub(channels(rt.ports["scheduler"]))
    run_ids = [(await ingest.IngestEvent(api_event(project), metadata=md)).outcomes[0].run_id for _ in range(4)]
    # one of them waits out a retry backoff: PENDING but not claimable
    await db.execute("UPDATE awooop_run_state SET not_before = now() + interval '1 hour' WHERE run_id = $1", run_ids[3])

    async def sampled(pending: float, running: float, claimable: float) -> bool:
        return (
            gauge("awooop_scheduler_runs", project=project, status="PENDING"),
            gauge("awooop_scheduler_runs", project=project, status="RUNNING"),
            gauge("awooop_scheduler_runs_claimable", project=project),
        ) == (pending, running, claimable)

    await eventually(lambda: sampled(4, 0, 3), what="4 pending, 3 claimable")
    await eventually(
        lambda: asyncio.sleep(0, (gauge("awooop_scheduler_oldest_claimable_age_seconds", project=project) or 0) > 0),
        what="the oldest claimable run's age",
    )
    assert gauge("awooop_scheduler_runs", project=project, status="WAITING_APPROVAL") == 0  # every status exported

    waits_before = gauge("awooop_scheduler_claim_wait_seconds_count", project=project) or 0
    claimed = await sched.ClaimRuns(
        scheduler_pb2.ClaimRunsRequest(worker_id="w", project_ids=[project], max_runs=2), metadata=md
    )
    assert len(claimed.runs) == 2
    assert gauge("awooop_scheduler_claim_wait_seconds_count", project=project) == waits_before + 2
    wait_sum = gauge("awooop_scheduler_claim_wait_seconds_sum", project=project) or 0
    assert 0 < wait_sum < 600  # seconds since the runs were queued, not a timestamp
    await eventually(lambda: sampled(2, 2, 1), what="2 pending (1 claimable), 2 running")

    # the runs end: the project's series stay, at 0
    for r in claimed.runs:
        await sched.CompleteRun(scheduler_pb2.CompleteRunRequest(lease=r.lease), metadata=md)
    await db.execute("UPDATE awooop_run_state SET status = 'CANCELLED' WHERE project_id = $1", project)
    await eventually(lambda: sampled(0, 0, 0), what="an empty queue")
    assert gauge("awooop_scheduler_oldest_claimable_age_seconds", project=project) == 0


def test_project_labels_are_bounded() -> None:
    labels = sched_metrics.ProjectLabels(2)
    assert [labels(p) for p in ("a", "b", "c", "a", "d")] == ["a", "b", "_other", "a", "_other"]


# ---------------------------------------------------------------- real endpoints


@dataclass
class Served:
    proc: subprocess.Popen[bytes]
    ports: dict[str, int]
    metrics_port: int
    log: Path

    def scrape(self) -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as resp:
            return str(resp.read().decode())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


async def serve(settings: Settings, tmp_path: Path, *services: str, **overrides: Any) -> Served:
    """`awooop serve <services>` as a real process with its own metrics endpoint."""
    ports = {s: free_port() for s in services}
    metrics_port = free_port()
    if "gateway" in ports:  # the saga calls this process's gateway
        overrides.setdefault("gateway_addr", f"127.0.0.1:{ports['gateway']}")
    if "saga" in ports and "internal_api_key" not in overrides:  # without it the saga is NOT_SERVING
        overrides["internal_api_key"] = await internal_key(settings.database_url)
    s = settings.with_(metrics_port=metrics_port, **{f"{n}_port": p for n, p in ports.items()}, **overrides)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWOOOP_", "OTEL_"))}
    env.update(settings_env(s))
    log = tmp_path / f"{'-'.join(services)}.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awooop.cli", "serve", *services], env=env, cwd=ROOT, stdout=out, stderr=out
        )
    served = Served(proc, ports, metrics_port, log)
    try:
        for p in ports.values():
            await wait_healthy(p)
    except AssertionError:
        served.stop()
        raise AssertionError(f"{services} did not start:\n{log.read_text()}") from None
    return served


@pytest.fixture
def served() -> Iterator[list[Served]]:
    started: list[Served] = []
    yield started
    for s in started:
        s.stop()


def samples(body: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(body)
        for s in fam.samples
    }


def value(body: str, name: str, **labels: str) -> float | None:
    return samples(body).get((name, tuple(sorted(labels.items()))))


async def test_each_process_exports_only_its_own_metrics_every_series_from_the_start_and_promtool_accepts_them(
    settings: Settings, tmp_path: Path, served: list[Served]
) -> None:
    promtool = need("promtool")
    own = {
        "ingest": "awooop_ingest_",
        "scheduler": "awooop_scheduler_",
        "saga": "awooop_saga_",
        "gateway": "awooop_gateway_",
    }
    services = {
        "ingest": "awooop.ingest.v1.IngestService",
        "scheduler": "awooop.scheduler.v1.SchedulerService",
        "saga": "awooop.saga.v1.SagaService",
        "gateway": "awooop.tools.v1.ToolGatewayService",
    }
    counts = {}
    for name in own:
        proc = await serve(settings, tmp_path, name, queue_metrics_interval=0.2)
        served.append(proc)
        if name == "scheduler":  # the queue sampler's first pass
            await eventually(
                lambda p=proc: asyncio.sleep(0, "awooop_scheduler_queue_sampled_timestamp_seconds " in p.scrape()),
                what="a queue sample",
            )
        body = await asyncio.to_thread(proc.scrape)
        names = {fam.name for fam in text_string_to_metric_families(body)}
        assert "_created" not in body
        assert not any(n.startswith("awooop_worker_") for n in names), "the worker SDK's metrics on a server"
        for other, prefix in own.items():
            if other != name:
                assert not any(n.startswith(prefix) for n in names), f"{other}'s metrics on the {name} endpoint"
        assert any(n.startswith(own[name]) for n in names)
        # every method of the service, every code, at 0 before any call
        handled = [
            s
            for fam in text_string_to_metric_families(body)
            if fam.name == "grpc_server_handled"
            for s in fam.samples
            if s.labels["grpc_service"] == services[name]
        ]
        methods = {s.labels["grpc_method"] for s in handled}
        assert methods and len(handled) == 17 * len(methods)
        assert {s.labels["grpc_code"] for s in handled} >= {"OK", "Internal", "Unavailable", "InvalidArgument"}
        assert all(s.value == 0 for s in handled)
        assert value(body, "grpc_server_started_total", grpc_type="unary", grpc_service=services[name],
                     grpc_method=sorted(methods)[0]) == 0  # fmt: skip
        lint = await asyncio.to_thread(
            subprocess.run, [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=60
        )
        assert lint.returncode == 0 and not lint.stdout.strip() and not lint.stderr.strip(), lint.stdout + lint.stderr
        counts[name] = sum(1 for line in body.splitlines() if line and not line.startswith("#"))

    # the labelled counters the shipped rules use are there, at 0
    saga = await asyncio.to_thread(served[2].scrape)
    assert value(saga, "awooop_saga_compensation_steps_total", outcome="failed") == 0
    scheduler = await asyncio.to_thread(served[1].scrape)
    assert value(scheduler, "awooop_scheduler_reaped_total", outcome="failed") == 0
    assert value(scheduler, "awooop_scheduler_lease_lost_total", method="Heartbeat") == 0
    assert value(scheduler, "awooop_background_runs_total", loop="scheduler.reaper", outcome="error") == 0
    ingest = await asyncio.to_thread(served[0].scrape)
    assert value(ingest, "awooop_ingest_dedupe_answers_total", channel="line", path="redis", answer="duplicate") == 0
    print("series per process:", json.dumps(counts))


# ---------------------------------------------------------------- a real Prometheus and the shipped rules


@dataclass
class Prometheus:
    url: str

    def get(self, path: str, **params: str) -> Any:
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        with urllib.request.urlopen(f"{self.url}{path}{query}", timeout=10) as resp:
            return json.loads(resp.read())["data"]

    def firing(self) -> list[dict[str, str]]:
        return [a["labels"] for a in self.get("/api/v1/alerts")["alerts"] if a["state"] == "firing"]


@pytest.fixture
async def prometheus_for(tmp_path: Path) -> AsyncIterator[Any]:
    """prometheus_for(targets) -> a real Prometheus (1 s scrape and evaluation) with the shipped
    rules, their `for:` durations shortened to 0 s so a test does not wait 10 minutes."""
    binary = need("prometheus")
    procs: list[subprocess.Popen[bytes]] = []

    async def start(targets: list[str]) -> Prometheus:
        rules = tmp_path / "alerts.yml"
        rules.write_text(re.sub(r"for: \d+m", "for: 0s", ALERTS.read_text()))
        config = tmp_path / "prometheus.yml"
        config.write_text(
            json.dumps(
                {
                    "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                    "rule_files": [str(rules)],
                    "scrape_configs": [{"job_name": "awooop", "static_configs": [{"targets": targets}]}],
                }
            )
        )
        port = free_port()
        log = tmp_path / "prometheus.log"
        with open(log, "wb") as out:
            procs.append(
                subprocess.Popen(
                    [
                        binary,
                        f"--config.file={config}",
                        f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                        f"--web.listen-address=127.0.0.1:{port}",
                    ],
                    stdout=out,
                    stderr=out,
                )
            )
        prom = Prometheus(f"http://127.0.0.1:{port}")

        async def ready() -> bool:
            try:
                await asyncio.to_thread(urllib.request.urlopen, f"{prom.url}/-/ready", timeout=2)
                return True
            except OSError:
                return False

        await eventually(ready, timeout=30, what="prometheus ready")
        return prom

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(15)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


async def test_a_real_prometheus_fires_the_shipped_rules_on_the_first_compensation_failure_and_an_orphan_run(
    settings: Settings, tmp_path: Path, served: list[Served], make_key: Any, prometheus_for: Any
) -> None:
    project, orphan = "prom", "orphan"
    everything = ("ingest", "scheduler", "saga", "gateway")
    proc = await serve(settings, tmp_path, *everything, queue_metrics_interval=0.2, compensation_interval=0.2)
    served.append(proc)
    prom = await prometheus_for([f"127.0.0.1:{proc.metrics_port}"])

    async def failed_compensations_at_zero() -> bool:
        result = prom.get("/api/v1/query", query='awooop_saga_compensation_steps_total{outcome="failed"}')["result"]
        return bool(result) and result[0]["value"][1] == "0"

    # the series is scraped at 0 before anything fails (the point of exporting it from start-up)
    await eventually(failed_compensations_at_zero, timeout=30, interval=0.5, what="the failed counter scraped at 0")
    assert not [a for a in prom.firing() if a["alertname"] == "AwooopCompensationFailed"]

    md = await make_key("prom-admin", {project: ["admin"], orphan: ["admin"]})
    key = md[0][1].removeprefix("Bearer ")
    async with grpc.aio.insecure_channel(f"127.0.0.1:{proc.ports['ingest']}") as ch:
        stub = ingest_pb2_grpc.IngestServiceStub(ch)
        await stub.IngestEvent(api_event(orphan), metadata=md)  # nobody claims this project's runs
        await stub.IngestEvent(api_event(project), metadata=md)

    async def handler(ctx: RunContext) -> None:
        await ctx.step(
            "scale",
            lambda call: {"previous_replicas": 2},
            tool_id="k8s_scale_deployment",
            params={"deployment": "api", "replicas": 5},
            compensation={
                "tool_id": "k8s_scale_deployment",
                "params": {"deployment": "api", "replicas": 2, "simulate_failure": "cluster unreachable"},
            },
        )
        await ctx.fail("the rollout broke")

    worker = Worker(
        handler,
        projects=[project],
        key=key,
        scheduler=f"127.0.0.1:{proc.ports['scheduler']}",
        saga=f"127.0.0.1:{proc.ports['saga']}",
        claim_wait=1,
    )
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:

        async def fired() -> bool:
            alerts = prom.firing()
            names = {(a["alertname"], a.get("project", "")) for a in alerts}
            return ("AwooopCompensationFailed", "") in names and ("AwooopRunsStuckClaimable", orphan) in names

        await eventually(fired, timeout=60, interval=0.5, what="the shipped alerts to fire")
        assert not [a for a in prom.firing() if a["alertname"] in ("AwooopInternalError", "AwooopStoreUnavailable")]
        # every query of the shipped dashboard is valid PromQL for this Prometheus (2.42)
        for expr in dashboard_exprs():
            q = expr.replace("$__rate_interval", "1m").replace("$project", ".*")
            assert prom.get("/api/v1/query", query=q)["resultType"] == "vector", q
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)


# ---------------------------------------------------------------- the shipped rules and dashboard


DASHBOARD = ROOT / "deploy" / "grafana" / "awooop.json"
# named by the rules before its service exports it (webhook endpoints)
NOT_YET_EXPORTED = {"awooop_webhook_signature_failures_total"}


def dashboard_exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [t["expr"] for p in panels for t in p.get("targets", [])]


def test_the_rules_and_the_dashboard_name_only_metrics_the_services_export() -> None:
    from services.common.runtime import SERVICES, load_service

    for name in SERVICES:
        load_service(name)  # imports each service's metrics
    exported: set[str] = set()
    for fam in REGISTRY.collect():
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_count", "_sum")}.get(fam.type, ("",))
        exported |= {fam.name + s for s in suffixes}
    used = set(re.findall(r"\b(?:awooop|grpc_server)_[a-z_]+", ALERTS.read_text() + "\n".join(dashboard_exprs())))
    assert used - exported <= NOT_YET_EXPORTED, used - exported - NOT_YET_EXPORTED
    assert len(used) > 15


def test_one_project_label_dashboard_text_with_words_in_flight_as_a_count_and_real_audit_actions() -> None:
    """What a platform team meets on the dashboard and in the rules: per-project metrics are all
    labelled `project` (the webhook metric was `project_id`), every text panel says something, RPCs
    in flight is a count (not a difference of rates), and an alert names the audit action the
    timeline shows."""
    from services.ingest import metrics as ingest_metrics

    ingest_metrics.SIGNATURE_FAILURES.labels(project="p", channel="telegram", endpoint="e")  # not project_id
    ingest_metrics.SIGNATURE_FAILURES.remove("p", "telegram", "e")
    rules, exprs = ALERTS.read_text(), dashboard_exprs()
    assert not re.findall(r"\bproject_id\b", rules + "\n".join(exprs))

    panels = json.loads(DASHBOARD.read_text())["panels"]
    for p in panels:
        if p["type"] == "text":
            assert p["title"] and p["options"]["content"].strip(), p
    in_flight = [t["expr"] for p in panels if p["title"] == "RPCs in flight" for t in p["targets"]]
    assert in_flight and not any(re.search(r"\brate\(.*\)\s*-\s*.*\brate\(", e) for e in in_flight), in_flight
    for e in exprs:
        assert not re.search(r"\brate\([^()]*\)\)\s*-\s*sum\b.*\brate\(", e), e

    source = "\n".join(p.read_text() for p in (ROOT / "services").rglob("*.py"))
    actions = re.findall(r"audit log \(([A-Z_]+)\)", rules)
    assert actions
    for action in actions:
        assert re.search(rf"""action="{action}"|= "{action}"$""", source, re.MULTILINE), action
