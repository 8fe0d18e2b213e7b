"""Channel events satisfy event waits by the documented match (awooop/worker/event_matches.py;
the event side: awooop_event_key, migration 0171), arriving through the real webhook paths of
ingest's HTTP server: a Telegram reply in the same chat, an Alertmanager resolve of the same
group, with the look-back (an event that arrived just before the wait counts). Events of other
chats, other groups and firing notifications do not; and the real Alertmanager (Debian's
prometheus-alertmanager) delivering an incident and its resolve, the incident's run parked on the
resolve of its own group. Real services, a real worker."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
import uuid
from typing import Any

import aiohttp
import asyncpg
import pytest
import yaml

from awooop.common.v1 import common_pb2
from awooop.ingest.v1 import ingest_pb2
from awooop.worker import Client, RunContext, Worker, to_struct
from awooop.worker.event_matches import key_of
from services.common.db import create_pool
from services.common.settings import Settings
from services.scheduler import waits
from tests.harness.helpers import eventually
from tests.harness.helpers import key_of as api_key

PROJECT = "ew"
CHAT = -1001234567890  # a group chat's id, as Telegram sends it (negative)
OTHER_CHAT = 1111111
GROUP = '{}/{severity="page"}:{alertname="DiskFull"}'  # a groupKey as Alertmanager builds it


def telegram_update(update_id: int, chat_id: int, text: str) -> dict[str, Any]:
    """A message update as Telegram posts it to a bot's webhook (core.telegram.org/bots/api#update)."""
    return {
        "update_id": update_id,
        "message": {
            "message_id": update_id,
            "date": 1441645532,
            "chat": {"id": chat_id, "type": "supergroup", "title": "ops"},
            "from": {"id": 42, "is_bot": False, "first_name": "Ana"},
            "text": text,
        },
    }


def alertmanager_notification(status: str, group_key: str = GROUP) -> dict[str, Any]:
    """Alertmanager's webhook body (version 4, prometheus.io/docs/alerting/latest/configuration/#webhook_config)."""
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": "awooop",
        "groupLabels": {"alertname": "DiskFull"},
        "commonLabels": {"alertname": "DiskFull", "severity": "page"},
        "commonAnnotations": {"summary": "disk almost full"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": status,
                "labels": {"alertname": "DiskFull", "instance": "db1", "severity": "page"},
                "annotations": {"summary": "disk almost full"},
                "startsAt": "2026-12-04T03:00:00Z",
                "endsAt": "2026-12-04T03:10:00Z" if status == "resolved" else "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "c4a8e1f0b2d3e4f5",
            }
        ],
    }


class Harness:
    def __init__(self, base: str, secrets: dict[str, str], admin: Client, worker_key: str, addrs: dict[str, str]):
        self.base, self.secrets, self.admin, self.worker_key, self.addrs = base, secrets, admin, worker_key, addrs

    async def telegram(self, body: dict[str, Any]) -> str:
        headers = {"X-Telegram-Bot-Api-Secret-Token": self.secrets["telegram"]}
        return await self._post(f"/v1/webhooks/{PROJECT}/telegram/bot", body, headers)

    async def alertmanager(self, body: dict[str, Any]) -> str:
        headers = {"Authorization": f"Bearer {self.secrets['alertmanager']}"}
        return await self._post(f"/v1/webhooks/{PROJECT}/alertmanager/am", body, headers)

    async def _post(self, path: str, body: dict[str, Any], headers: dict[str, str]) -> str:
        async with aiohttp.ClientSession() as http, http.post(self.base + path, json=body, headers=headers) as r:
            answer = await r.json(content_type=None)
            assert r.status == 200, answer
        return str(answer["outcomes"][0]["run_id"])

    async def api_run(self, payload: dict[str, Any]) -> str:
        resp = await self.admin.call(
            self.admin.ingest.IngestEvent,
            ingest_pb2.IngestEventRequest(
                project_id=PROJECT,
                channel_type=common_pb2.CHANNEL_TYPE_API,
                provider_event_id=f"evt-{os.urandom(6).hex()}",
                payload=to_struct(payload),
            ),
        )
        return str(resp.outcomes[0].run_id)


@pytest.fixture
async def harness(start_services: Any, make_key: Any) -> Any:
    rt = await start_services(
        "ingest", "scheduler", "saga", wait_sweep_interval=0.2, reaper_interval=0.1, auth_cache_seconds=0
    )
    addrs = {s: f"127.0.0.1:{rt.ports[s]}" for s in ("ingest", "scheduler", "saga")}
    admin = Client(key=api_key(await make_key("ew-ops", {PROJECT: ["admin"]})), **addrs)
    secrets = {}
    for name, channel, endpoint in (
        ("telegram", common_pb2.CHANNEL_TYPE_TELEGRAM, "bot"),
        ("alertmanager", common_pb2.CHANNEL_TYPE_ALERTMANAGER, "am"),
    ):
        resp = await admin.call(
            admin.ingest.CreateEndpoint,
            ingest_pb2.CreateEndpointRequest(project_id=PROJECT, channel_type=channel, name=endpoint),
        )
        secrets[name] = resp.secret
    worker_key = api_key(await make_key("ew-worker", {PROJECT: ["worker"]}, "service"))
    yield Harness(f"http://127.0.0.1:{rt.http_ports['ingest']}", secrets, admin, worker_key, addrs)
    await admin.close()


async def _status(db: asyncpg.Connection, run_id: str) -> tuple[str, Any]:
    row = await db.fetchrow("SELECT status, output FROM awooop_run_state WHERE run_id = $1", uuid.UUID(run_id))
    assert row is not None
    return row["status"], json.loads(row["output"]) if row["output"] is not None else None


async def _wait_open(db: asyncpg.Connection, run_id: str) -> bool:
    return bool(
        await db.fetchval("SELECT status = 'open' FROM awooop_wait WHERE run_id = $1", uuid.UUID(run_id)) or False
    )


async def _parked(db: asyncpg.Connection, run_id: str) -> bool:
    return (await _status(db, run_id))[0] == "WAITING_TOOL" and await _wait_open(db, run_id)


async def handler(ctx: RunContext) -> dict[str, Any]:
    """API runs wait for the event their input names; the channels' own event runs just end."""
    if ctx.run.channel_type != common_pb2.CHANNEL_TYPE_API:
        return {"event": True}
    event = await ctx.wait_for_event(ctx.input["match"], timeout=120, lookback=ctx.input.get("lookback", 300))
    return {"event_run_id": event["run_id"], "payload": event["payload"]}


async def test_a_run_waits_for_a_telegram_reply_that_arrives_through_the_webhook_and_resumes_with_it(
    harness: Harness, db: Any, settings: Settings
) -> None:
    pool = await create_pool(settings)
    worker = Worker(
        handler, projects=[PROJECT], key=harness.worker_key, scheduler=harness.addrs["scheduler"],
        saga=harness.addrs["saga"], heartbeat_interval=0.2, lease_ttl=30, claim_wait=1,
    )  # fmt: skip
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        # the bot asked in the chat (elsewhere); the run waits for the reply
        waiting = await harness.api_run({"match": {"channel": "telegram", "chat_id": CHAT}})
        await eventually(lambda: _parked(db, waiting), timeout=30, what="the run parked on its event wait")
        # a message of another chat is no reply: a matcher pass leaves the wait open
        unrelated = await harness.telegram(telegram_update(5001, OTHER_CHAT, "unrelated"))
        await waits.match_events(pool)
        assert await _wait_open(db, waiting)
        # the reply in the same chat, through the real webhook path, resumes the run with it
        reply_run = await harness.telegram(telegram_update(5002, CHAT, "yes, roll back"))

        async def completed() -> Any:
            status, output = await _status(db, waiting)
            return output if status == "COMPLETED" else None

        output = await eventually(completed, timeout=30, what="resumed with the reply")
        assert output["event_run_id"] == reply_run
        assert output["payload"]["message"]["text"] == "yes, roll back"
        assert output["payload"]["message"]["chat"]["id"] == CHAT

        # look-back: a message that arrived before the wait was created (within it) still counts
        late = await harness.api_run({"match": {"channel": "telegram", "chat_id": OTHER_CHAT}})

        async def late_done() -> Any:
            status, output = await _status(db, late)
            return output if status == "COMPLETED" else None

        output = await eventually(late_done, timeout=30, what="matched from the look-back")
        assert output["event_run_id"] == unrelated and output["payload"]["message"]["text"] == "unrelated"
        # a zero look-back takes only what arrives later: the earlier messages of CHAT do not count
        strict = await harness.api_run({"match": {"channel": "telegram", "chat_id": CHAT}, "lookback": 0.001})
        await eventually(lambda: _parked(db, strict), timeout=30, what="the strict run parked")
        await waits.match_events(pool)
        assert await _wait_open(db, strict)
        reply = await harness.telegram(telegram_update(5004, CHAT, "later"))

        async def strict_done() -> Any:
            status, output = await _status(db, strict)
            return output if status == "COMPLETED" else None

        assert (await eventually(strict_done, timeout=30, what="the strict run resumed"))["event_run_id"] == reply
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()


async def test_a_run_waits_for_the_alertmanager_resolve_of_its_group(
    harness: Harness, db: Any, settings: Settings
) -> None:
    pool = await create_pool(settings)
    worker = Worker(
        handler, projects=[PROJECT], key=harness.worker_key, scheduler=harness.addrs["scheduler"],
        saga=harness.addrs["saga"], heartbeat_interval=0.2, lease_ttl=30, claim_wait=1,
    )  # fmt: skip
    task = asyncio.create_task(worker.run(install_signal_handlers=False))
    try:
        # the incident fires (its own run); a run waits for the group's resolve
        await harness.alertmanager(alertmanager_notification("firing"))
        waiting = await harness.api_run({"match": {"channel": "alertmanager", "group_key": GROUP}})
        await eventually(lambda: _parked(db, waiting), timeout=30, what="the run parked on the resolve")
        # the firing notification (even within the look-back) and another group's resolve do not match
        await harness.alertmanager(alertmanager_notification("resolved", group_key='{}:{alertname="Other"}'))
        await waits.match_events(pool)
        assert await _wait_open(db, waiting)
        resolve_run = await harness.alertmanager(alertmanager_notification("resolved"))

        async def completed() -> Any:
            status, output = await _status(db, waiting)
            return output if status == "COMPLETED" else None

        output = await eventually(completed, timeout=30, what="resumed with the resolve")
        assert output["event_run_id"] == resolve_run
        assert output["payload"]["status"] == "resolved" and output["payload"]["groupKey"] == GROUP
        # look-back: a run that starts waiting after the resolve arrived takes it at once
        after = await harness.api_run({"match": {"channel": "alertmanager", "group_key": GROUP}})

        async def after_done() -> Any:
            status, output = await _status(db, after)
            return output if status == "COMPLETED" else None

        assert (await eventually(after_done, timeout=30, what="the look-back match"))["event_run_id"] == resolve_run
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        await pool.close()


def test_the_match_vocabulary_is_checked_and_mapped_once() -> None:
    assert key_of("order-7") == ("api", "order-7")
    assert key_of({"channel": "api", "correlation_key": "order-7"}) == ("api", "order-7")
    assert key_of({"channel": "telegram", "chat_id": CHAT}) == ("telegram", str(CHAT))
    assert key_of({"channel": "telegram", "chat_id": str(CHAT)}) == ("telegram", str(CHAT))
    channel, digest = key_of({"channel": "alertmanager", "group_key": GROUP})
    assert channel == "alertmanager" and len(digest) == 32
    for bad in (
        {"channel": "smtp", "to": "x"},
        {"channel": "telegram", "chat_id": "ops"},
        {"channel": "telegram", "chat_id": True},
        {"channel": "telegram", "chat": 1},
        {"channel": "alertmanager", "group_key": ""},
        {"channel": "api", "correlation_key": "k", "extra": 1},
    ):
        with pytest.raises(ValueError):
            key_of(bad)


# --- the real Alertmanager: an incident's run waits for its own group's resolve ------------------

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")


def _free_port() -> int:
    # Alertmanager cannot report an ephemeral port back, so one is reserved and handed to it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def incident_handler(ctx: RunContext) -> dict[str, Any]:
    """A firing notification's run waits for the resolve of its own group; the others just end."""
    if ctx.run.channel_type == common_pb2.CHANNEL_TYPE_ALERTMANAGER and ctx.input.get("status") == "firing":
        match = {"channel": "alertmanager", "group_key": ctx.input["groupKey"]}
        resolve = await ctx.wait_for_event(match, timeout=120)
        return {"resolved_by": resolve["run_id"], "status": resolve["payload"]["status"]}
    return {"event": True}


async def test_the_real_alertmanager_resolve_of_the_group_resumes_the_incidents_run(
    start_services: Any, make_key: Any, db: Any, tmp_path: Any
) -> None:
    if ALERTMANAGER is None:
        if os.environ.get("CI") == "true":
            raise RuntimeError("prometheus-alertmanager is missing; .ci/install-debian installs it")
        pytest.skip("prometheus-alertmanager not installed (.ci/install-debian)")
    rt = await start_services("ingest", "scheduler", "saga", wait_sweep_interval=0.2, auth_cache_seconds=0)
    admin = api_key(await make_key("ew-ops", {PROJECT: ["admin"]}))
    worker_key = api_key(await make_key("ew-worker", {PROJECT: ["worker"]}, "service"))
    # the receiver as docs/channels.md sets it up: `awooop channels add alertmanager`
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": admin}
    args = [
        "channels",
        "add",
        "alertmanager",
        "prod",
        "--project",
        PROJECT,
        "--ingest",
        f"127.0.0.1:{rt.ports['ingest']}",
    ]
    added = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "awooop.cli", *args, "--url", f"http://127.0.0.1:{rt.http_ports['ingest']}", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    config = yaml.safe_load(json.loads(added.stdout)["setup"])
    config["route"].update(group_by=["alertname"], group_wait="1s", group_interval="1s", repeat_interval="1h")
    (tmp_path / "alertmanager.yml").write_text(yaml.safe_dump(config))
    port = _free_port()
    am = f"http://127.0.0.1:{port}"
    log = (tmp_path / "alertmanager.log").open("w")
    proc = subprocess.Popen(
        [
            str(ALERTMANAGER),
            f"--config.file={tmp_path / 'alertmanager.yml'}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    worker = Worker(
        incident_handler, projects=[PROJECT], key=worker_key, scheduler=f"127.0.0.1:{rt.ports['scheduler']}",
        saga=f"127.0.0.1:{rt.ports['saga']}", heartbeat_interval=0.2, lease_ttl=30, claim_wait=1,
    )  # fmt: skip
    task = asyncio.create_task(worker.run(install_signal_handlers=False))

    async def post_alert(ends_at: dt.datetime | None = None) -> None:
        alert: dict[str, Any] = {
            "labels": {"alertname": "DiskFull", "instance": "db1", "severity": "page"},
            "annotations": {"summary": "disk almost full"},
            "startsAt": started.isoformat().replace("+00:00", "Z"),
        }
        if ends_at is not None:
            alert["endsAt"] = ends_at.isoformat().replace("+00:00", "Z")
        async with aiohttp.ClientSession() as http, http.post(f"{am}/api/v2/alerts", json=[alert]) as r:
            assert r.status == 200, await r.text()

    async def runs(status: str) -> list[tuple[str, str]]:
        rows = await db.fetch(
            "SELECT run_id, status FROM awooop_run_state WHERE project_id = $1 AND input ->> 'status' = $2"
            " ORDER BY created_at",
            PROJECT,
            status,
        )
        return [(str(r["run_id"]), r["status"]) for r in rows]

    try:

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as http, http.get(f"{am}/-/ready") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout=30, what="Alertmanager to be ready")
        started = dt.datetime.now(dt.UTC).replace(microsecond=0)
        await post_alert()

        async def incident_parked() -> str:
            firing = await runs("firing")
            return firing[0][0] if firing and firing[0][1] == "WAITING_TOOL" else ""

        incident = await eventually(incident_parked, timeout=60, what="the incident's run parked on its resolve")
        await post_alert(ends_at=dt.datetime.now(dt.UTC))

        async def resolved() -> Any:
            status, output = await _status(db, incident)
            return output if status == "COMPLETED" else None

        output = await eventually(resolved, timeout=60, what="the resolve delivered and matched")
        [(resolve_run, _)] = await runs("resolved")
        assert output == {"resolved_by": resolve_run, "status": "resolved"}
    finally:
        worker.stop()
        await asyncio.wait_for(task, 30)
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
