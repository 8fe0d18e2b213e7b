"""The real Alertmanager (Debian's prometheus-alertmanager) delivering to the ingest service's
webhook endpoint with bearer credentials, exactly as docs/channels.md tells a user to set it up.

Alerts are posted to Alertmanager's own API; Alertmanager groups, repeats, retries and resolves
them on its own schedule (short intervals here). Between the two sits a lossy link: it forwards
every delivery to the endpoint, but answers Alertmanager 503 for the first two, so Alertmanager's
own retry logic sends the same notification again after the endpoint already stored it.

Shown: fire + its repeats + the retries after 503 = 1 run; resolve = its own run; the same alert
firing again (a new incident, new startsAt) = a new run, whose repeats are duplicates again.

Written for Alertmanager 0.25 (Debian 12, .ci/install-debian prints the version): its v2 API (/api/v2/alerts)
and the webhook payload it sends.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp import web

from services.common import principals
from tests.harness.helpers import eventually

PROJECT = "oncall"
BINARY = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")

if BINARY is None:
    if os.environ.get("CI") == "true":
        raise RuntimeError("prometheus-alertmanager is missing; .ci/install-debian installs it")
    pytest.skip("prometheus-alertmanager not installed (.ci/install-debian)", allow_module_level=True)


def free_port() -> int:
    # Alertmanager cannot report an ephemeral port back, so one is reserved and handed to it
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class LossyLink:
    """Forwards each delivery to the endpoint and records the endpoint's answer; the first
    `fail_first` deliveries are answered 503 to Alertmanager whatever the endpoint said."""

    def __init__(self, target: str, fail_first: int) -> None:  # target: the endpoint's base URL
        self.target = target
        self.fail_first = fail_first
        self.deliveries: list[tuple[dict[str, Any], int, dict[str, Any]]] = []
        self.runner: web.AppRunner | None = None

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() in ("authorization", "content-type")}
        url = self.target + request.path
        async with aiohttp.ClientSession() as http, http.post(url, data=body, headers=headers) as r:
            answer = await r.json(content_type=None)
            status = r.status
        self.deliveries.append((json.loads(body), status, answer))
        if len(self.deliveries) <= self.fail_first:
            return web.json_response({"error": "injected"}, status=503)
        return web.json_response(answer, status=status)

    async def start(self) -> int:
        app = web.Application()
        app.router.add_post("/{path:.*}", self.handle)
        self.runner = web.AppRunner(app)
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        return int(self.runner.addresses[0][1])

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()


def am_config(printed: str) -> str:
    """The receiver config `awooop channels add` printed, as a user pastes it, with the route's
    intervals shortened for the test."""
    config = yaml.safe_load(printed)
    config["route"].update(group_by=["alertname"], group_wait="1s", group_interval="1s", repeat_interval="2s")
    return str(yaml.safe_dump(config))


def iso(t: dt.datetime) -> str:
    return t.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")


async def post_alert(am: str, starts_at: dt.datetime, ends_at: dt.datetime | None = None) -> None:
    alert: dict[str, Any] = {
        "labels": {"alertname": "DiskFull", "instance": "db1", "severity": "page"},
        "annotations": {"summary": "disk almost full"},
        "startsAt": iso(starts_at),
    }
    if ends_at is not None:
        alert["endsAt"] = iso(ends_at)
    async with aiohttp.ClientSession() as http, http.post(f"{am}/api/v2/alerts", json=[alert]) as r:
        assert r.status == 200, await r.text()


async def test_real_alertmanager_incident_repeats_retries_resolution_and_refire(
    start_services, db, tmp_path: Path
) -> None:
    rt = await start_services("ingest")
    await principals.create_principal(db, "ops")
    await principals.grant_role(db, "ops", PROJECT, "admin")
    admin = (await principals.issue_key(db, "ops")).key
    link = LossyLink(f"http://127.0.0.1:{rt.http_ports['ingest']}", fail_first=2)
    link_port = await link.start()
    # one command, as docs/channels.md says; Alertmanager reaches the endpoint through the link
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | {"AWOOOP_API_KEY": admin}
    added = await asyncio.to_thread(  # the server shares this event loop
        subprocess.run,
        [
            sys.executable,
            "-m",
            "awooop.cli",
            "channels",
            "add",
            "alertmanager",
            "prod",
            "--project",
            PROJECT,
            "--ingest",
            f"127.0.0.1:{rt.ports['ingest']}",
            "--url",
            f"http://127.0.0.1:{link_port}",
            "--json",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )

    port = free_port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(am_config(json.loads(added.stdout)["setup"]))
    log = (tmp_path / "alertmanager.log").open("w")
    proc = subprocess.Popen(
        [
            str(BINARY),
            f"--config.file={config}",
            f"--storage.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",  # a single instance: no gossip port
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    am = f"http://127.0.0.1:{port}"

    async def runs() -> list[str]:
        rows = await db.fetch("SELECT run_id FROM awooop_run_state WHERE project_id = $1 ORDER BY created_at", PROJECT)
        return [str(r["run_id"]) for r in rows]

    def sent(status: str) -> list[tuple[dict[str, Any], int, dict[str, Any]]]:
        return [d for d in link.deliveries if d[0]["status"] == status]

    try:

        async def ready() -> bool:
            try:
                async with aiohttp.ClientSession() as http, http.get(f"{am}/-/ready") as r:
                    return r.status == 200
            except aiohttp.ClientError:
                return False

        await eventually(ready, timeout=30, what="Alertmanager to be ready")

        # 1. the incident fires; Alertmanager gets 503 twice and retries; then repeats it
        t1 = dt.datetime.now(dt.UTC).replace(microsecond=0)
        await post_alert(am, t1)

        async def repeated() -> bool:
            await post_alert(am, t1)  # Prometheus re-sends firing alerts on every evaluation
            return len(sent("firing")) >= 5

        await eventually(repeated, timeout=60, interval=0.5, what="503, 503, retry, and two repeats")
        firing = sent("firing")
        assert [d[1] for d in firing[:5]] == [200] * 5  # the endpoint itself always answered 200
        outcomes = [d[2]["outcomes"][0] for d in firing]
        assert not outcomes[0]["duplicate"] and all(o["duplicate"] for o in outcomes[1:])
        assert len({o["run_id"] for o in outcomes}) == 1
        assert await runs() == [outcomes[0]["run_id"]]
        incident = outcomes[0]["run_id"]

        # 2. resolved: its own run
        await post_alert(am, t1, ends_at=dt.datetime.now(dt.UTC))

        async def resolution_sent() -> bool:
            return len(sent("resolved")) >= 1

        await eventually(resolution_sent, timeout=30, what="the resolved notification")
        resolved = sent("resolved")[0][2]["outcomes"][0]
        assert not resolved["duplicate"] and resolved["run_id"] != incident
        assert await runs() == [incident, resolved["run_id"]]

        # 3. the same alert fires again later: a new incident, a new run; its repeats are duplicates
        before = len(sent("firing"))
        t3 = dt.datetime.now(dt.UTC).replace(microsecond=0) + dt.timedelta(seconds=1)

        async def refired() -> bool:
            await post_alert(am, t3)
            return len(sent("firing")) >= before + 2

        await eventually(refired, timeout=60, interval=0.5, what="the re-fire and one repeat")
        again = [d[2]["outcomes"][0] for d in sent("firing")[before:]]
        assert not again[0]["duplicate"] and all(o["duplicate"] for o in again[1:])
        assert again[0]["run_id"] not in (incident, resolved["run_id"])
        assert len({o["run_id"] for o in again}) == 1
        assert await runs() == [incident, resolved["run_id"], again[0]["run_id"]]
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()
        await link.stop()
