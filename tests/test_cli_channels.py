"""`awooop channels add|list|rotate|remove` as real subprocesses against a real ingest server:
the secret printed once (never by list), the provider setup printed with it, rotation with a
grace period, removal, and errors as `error: <CODE> <REASON>` with exit code 1."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from typing import Any

import aiohttp
import yaml

from services.common import principals

PROJECT = "cli-hooks"


async def cli(port: int, key: str, *args: str, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | extra_env
    env["AWOOOP_API_KEY"] = key
    cmd = [sys.executable, "-m", "awooop.cli", "channels", *args, "--ingest", f"127.0.0.1:{port}"]
    return await asyncio.to_thread(subprocess.run, cmd, env=env, capture_output=True, text=True, timeout=60)


async def test_channels_cli_add_list_rotate_remove(start_services, db) -> None:
    rt = await start_services("ingest")
    port, base = rt.ports["ingest"], f"http://127.0.0.1:{rt.http_ports['ingest']}"
    await principals.create_principal(db, "ops")
    await principals.grant_role(db, "ops", PROJECT, "admin")
    admin = (await principals.issue_key(db, "ops")).key

    added = await cli(port, admin, "add", "alertmanager", "prod", "--project", PROJECT, "--url", base, "--json")
    assert added.returncode == 0, added.stderr
    doc: dict[str, Any] = json.loads(added.stdout)
    secret, url = doc["secret"], doc["url"]
    assert url == f"{base}/v1/webhooks/{PROJECT}/alertmanager/prod"
    # the printed receiver is valid Alertmanager YAML carrying the URL and the bearer secret
    receiver = yaml.safe_load(doc["setup"])["receivers"][0]["webhook_configs"][0]
    assert receiver["url"] == url and receiver["http_config"]["authorization"]["credentials"] == secret
    async with aiohttp.ClientSession() as http:
        alert = {"groupKey": "g", "alerts": [{"fingerprint": "f", "status": "firing"}]}
        async with http.post(url, json=alert, headers={"Authorization": f"Bearer {secret}"}) as r:
            assert r.status == 200

    text = await cli(port, admin, "add", "telegram", "bot", "--project", PROJECT, "--url", "https://hooks.example")
    assert text.returncode == 0, text.stderr
    assert "secret: " in text.stdout and "setWebhook" in text.stdout and "secret_token=" in text.stdout
    assert "https://hooks.example/v1/webhooks/cli-hooks/telegram/bot" in text.stdout

    listed = await cli(port, admin, "list", "--project", PROJECT)
    assert listed.returncode == 0 and "prod" in listed.stdout and "bot" in listed.stdout
    assert secret not in listed.stdout
    as_json = await cli(port, admin, "list", "--project", PROJECT, "--json")
    assert secret not in as_json.stdout and len(json.loads(as_json.stdout)["endpoints"]) == 2

    rotated = await cli(port, admin, "rotate", "alertmanager", "prod", "--project", PROJECT, "--grace", "600")
    assert rotated.returncode == 0, rotated.stderr
    assert "previous secret is accepted until" in rotated.stdout and secret not in rotated.stdout

    removed = await cli(port, admin, "remove", "alertmanager", "prod", "--project", PROJECT)
    assert removed.returncode == 0 and "removed" in removed.stdout
    again = await cli(port, admin, "remove", "alertmanager", "prod", "--project", PROJECT)
    assert again.returncode == 1 and again.stderr.startswith("error: NOT_FOUND")

    await principals.create_principal(db, "feeder")
    await principals.grant_role(db, "feeder", PROJECT, "ingest")
    feeder = (await principals.issue_key(db, "feeder")).key
    denied = await cli(port, feeder, "add", "gitea", "repo", "--project", PROJECT)
    assert denied.returncode == 1 and denied.stderr.startswith("error: PERMISSION_DENIED FORBIDDEN")
    bad = await cli(port, admin, "add", "smtp", "x", "--project", PROJECT)
    assert bad.returncode == 2


async def test_channels_cli_prints_the_configured_http_port(start_services, db) -> None:
    """Without --url the printed webhook URL is the ingest service's configured HTTP port
    (AWOOOP_HTTP_PORT), not 8080, and a provider posting to it as printed gets a run."""
    rt = await start_services("ingest")
    port, http_port = rt.ports["ingest"], rt.http_ports["ingest"]
    await principals.create_principal(db, "ops")
    await principals.grant_role(db, "ops", PROJECT, "admin")
    admin = (await principals.issue_key(db, "ops")).key
    env = {"AWOOOP_HTTP_PORT": str(http_port)}

    added = await cli(port, admin, "add", "alertmanager", "porty", "--project", PROJECT, "--json", **env)
    assert added.returncode == 0, added.stderr
    doc: dict[str, Any] = json.loads(added.stdout)
    assert doc["url"] == f"http://127.0.0.1:{http_port}/v1/webhooks/{PROJECT}/alertmanager/porty"
    async with aiohttp.ClientSession() as http:
        alert = {"groupKey": "g", "alerts": [{"fingerprint": "f", "status": "firing"}]}
        async with http.post(doc["url"], json=alert, headers={"Authorization": f"Bearer {doc['secret']}"}) as r:
            assert r.status == 200

    rotated = await cli(port, admin, "rotate", "alertmanager", "porty", "--project", PROJECT, **env)
    assert rotated.returncode == 0, rotated.stderr
    assert f"url:    http://127.0.0.1:{http_port}/v1/webhooks/{PROJECT}/alertmanager/porty" in rotated.stdout
