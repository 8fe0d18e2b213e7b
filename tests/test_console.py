"""The operator console over HTTP (a real aiohttp client, real services, real Postgres): sign-in
and sessions, CSRF, headers, escaping, the approval link's states, authorization staying in the
services, runs filters and pagination. The browser flows are in test_console_browser.py."""

from __future__ import annotations

import html as html_lib
import json
import re
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

import aiohttp
import pytest_asyncio

from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import to_struct
from services.console.security import CSP
from tests.harness import rawhttp
from tests.harness.console import ConsoleEnv, start_console_env, stop_console_env


@pytest_asyncio.fixture(loop_scope="session")
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[ConsoleEnv]:
    e = await start_console_env(start_services, make_key, db)
    yield e
    await stop_console_env(e)


class Browser:
    """A cookie-keeping HTTP client that follows the console's forms like a browser would."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.http = aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True))  # cookies of 127.0.0.1

    async def get(self, path: str, **kw: Any) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.get(self.url + path, **kw) as r:
            return r.status, await r.text(), r

    async def post(self, path: str, data: dict[str, str], **kw: Any) -> tuple[int, str, aiohttp.ClientResponse]:
        async with self.http.post(self.url + path, data=data, **kw) as r:
            return r.status, await r.text(), r

    async def csrf(self, path: str) -> str:
        _, html, _ = await self.get(path)
        m = re.search(r'name="csrf" value="([^"]+)"', html)
        assert m, html
        return m.group(1)

    async def signin(self, key: str) -> tuple[int, str, aiohttp.ClientResponse]:
        token = await self.csrf("/signin")
        return await self.post("/signin", {"csrf": token, "api_key": key, "next": "/"}, allow_redirects=False)

    def session_cookie(self) -> str:
        for c in self.http.cookie_jar:
            if c.key == "awooop_console":
                return c.value
        return ""

    async def close(self) -> None:
        await self.http.close()


@pytest_asyncio.fixture(loop_scope="session")
async def browser(env: ConsoleEnv) -> AsyncIterator[Browser]:
    b = Browser(env.url)
    yield b
    await b.close()


async def test_sign_in_exchanges_the_key_for_a_strict_httponly_session_cookie(
    env: ConsoleEnv, browser: Browser
) -> None:
    status, _, r = await browser.get("/projects/ops/runs", allow_redirects=False)
    assert status == 303 and r.headers["Location"].startswith("/signin?next=")
    status, html, _ = await browser.signin("awk_nope_nope")
    assert status == 401 and "not accepted" in html and not browser.session_cookie()

    status, _, r = await browser.signin(env.admin_key)
    assert status == 303
    cookie = r.headers.getall("Set-Cookie")
    session = next(c for c in cookie if c.startswith("awooop_console="))
    assert "HttpOnly" in session and "SameSite=Strict" in session and "Secure" not in session  # plain HTTP here
    token = browser.session_cookie()
    # the store keeps neither the cookie nor the key in clear
    row = await env.db.fetchrow("SELECT * FROM awooop_console_session")
    assert row["session_hash"] != token.encode() and env.admin_key.encode() not in row["key_ciphertext"]
    assert row["key_label"].startswith("awk_") and env.admin_key.split("_")[2] not in row["key_label"]

    await env.create()  # a project the console knows (an admin of '*' sees the projects that have runs)
    status, html, _ = await browser.get("/projects/ops/runs")
    assert status == 200 and "Runs of ops" in html
    assert env.admin_key not in html and token not in html  # no secret in a page


async def test_every_answer_has_the_strict_headers(env: ConsoleEnv, browser: Browser) -> None:
    for path in ("/signin", "/nowhere", "/projects/ops/runs", "/static/console.css"):
        _, _, r = await browser.get(path, allow_redirects=False)
        assert r.headers["Content-Security-Policy"] == CSP, path
        assert "script-src" not in CSP and "'unsafe-inline'" not in CSP
        assert r.headers["X-Content-Type-Options"] == "nosniff" and r.headers["Referrer-Policy"] == "same-origin"
        assert r.headers["X-Frame-Options"] == "DENY"


async def test_secure_cookie_when_configured(start_services: Any, make_key: Any, db: Any) -> None:
    env = await start_console_env(start_services, make_key, db, console_secure_cookie=True)
    # a Secure cookie is not kept over plain HTTP: carry the sign-in form's cookie by hand, as a
    # browser behind the TLS-terminating proxy this setting is for would
    http = aiohttp.ClientSession()
    try:
        async with http.get(env.url + "/signin") as r:
            form_cookie = r.cookies["awooop_console_signin"]
            assert form_cookie["secure"] and form_cookie["httponly"] and form_cookie["samesite"] == "Strict"
            csrf = re.search(r'name="csrf" value="([^"]+)"', await r.text()).group(1)  # type: ignore[union-attr]
        async with http.post(
            env.url + "/signin",
            data={"csrf": csrf, "api_key": env.admin_key},
            headers={"Cookie": f"awooop_console_signin={form_cookie.value}"},
            allow_redirects=False,
        ) as r:
            assert r.status == 303
            session = r.cookies["awooop_console"]
            assert session["secure"] and session["httponly"] and session["samesite"] == "Strict"
    finally:
        await http.close()
        await stop_console_env(env)


async def test_a_run_waiting_for_its_build_says_so_and_the_runs_list_filters_by_build(
    env: ConsoleEnv, browser: Browser
) -> None:
    """A queued run with journaled steps, pinned to a build no live worker runs: its page shows its
    build and why it waits; the runs list shows the build and filters by it."""
    run_id = await env.create()
    lease = await env.claim(run_id)
    await env.scale_step(lease)
    await env.worker.call(env.worker.scheduler.ReleaseRun, scheduler_pb2.ReleaseRunRequest(lease=lease))
    moved = scheduler_pb2.SetRunBuildRequest(run_id=run_id, build_id="v0-gone")
    await env.admin.call(env.admin.scheduler.SetRunBuild, moved)
    await browser.signin(env.admin_key)
    status, page, _ = await browser.get(f"/runs/{run_id}")
    assert status == 200
    text = html_lib.unescape(page)
    assert "pinned to build v0-gone, which no live worker runs: it waits for one" in text
    assert re.search(r"build</\w+>\s*<\w+[^>]*>v0-gone", page), page
    status, page, _ = await browser.get("/projects/ops/runs?build=v0-gone")
    assert status == 200 and run_id in page and ">v0-gone<" in page
    status, page, _ = await browser.get("/projects/ops/runs?build=v9-none")
    assert status == 200 and run_id not in page and "No runs match these filters" in page


async def test_every_post_needs_the_sessions_csrf_token_and_our_origin(env: ConsoleEnv, browser: Browser) -> None:
    run_id = await env.create()
    await browser.signin(env.admin_key)
    path = f"/runs/{run_id}/cancel"
    status, _, _ = await browser.post(path, {"reason": "no token"}, allow_redirects=False)
    assert status == 403
    status, _, _ = await browser.post(path, {"reason": "wrong", "csrf": "0" * 64}, allow_redirects=False)
    assert status == 403
    token = await browser.csrf(f"/runs/{run_id}")
    status, _, _ = await browser.post(
        path, {"reason": "forged", "csrf": token}, headers={"Origin": "https://evil.example"}, allow_redirects=False
    )
    assert status == 403
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "PENDING"
    status, _, r = await browser.post(path, {"reason": "operator", "csrf": token}, allow_redirects=False)
    assert status == 303 and r.headers["Location"] == f"/runs/{run_id}?msg=cancelled"
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "CANCELLED"
    # a sign-in form posted without its own double-submit token is refused too
    status, _, _ = await browser.post("/signin", {"api_key": env.admin_key, "csrf": "x"}, allow_redirects=False)
    assert status == 403


async def test_sessions_end_at_sign_out_at_expiry_and_when_the_key_is_revoked(
    env: ConsoleEnv, browser: Browser
) -> None:
    await browser.signin(env.admin_key)
    token = await browser.csrf("/projects/ops/runs")
    cookie = browser.session_cookie()
    status, _, r = await browser.post("/signout", {"csrf": token}, allow_redirects=False)
    assert status == 303 and r.headers["Location"] == "/signin?msg=signedout"
    assert await env.db.fetchval("SELECT revoked_at IS NOT NULL FROM awooop_console_session")
    # the old cookie, replayed, is worth nothing
    status, _, r = await browser.get("/projects/ops/runs", cookies={"awooop_console": cookie}, allow_redirects=False)
    assert status == 303 and r.headers["Location"].startswith("/signin")

    await browser.signin(env.admin_key)
    await env.db.execute("UPDATE awooop_console_session SET expires_at = now() - interval '1 second'")
    status, _, r = await browser.get("/projects/ops/runs", allow_redirects=False)
    assert status == 303 and r.headers["Location"].startswith("/signin")

    # a key revoked in the services ends its console session at the next page
    b2 = Browser(env.url)
    try:
        await b2.signin(env.viewer_key)
        status, _, _ = await b2.get("/projects/ops/runs")
        assert status == 200
        key_id = env.viewer_key.split("_")[1]
        await env.db.execute("UPDATE awooop_api_key SET revoked_at = now() WHERE key_id = $1", key_id)
        status, _, r = await b2.get("/projects/ops/runs", allow_redirects=False)
        assert status == 303 and r.headers["Location"] == "/signin?msg=expired"
    finally:
        await b2.close()


async def test_authorization_stays_in_the_services(env: ConsoleEnv, browser: Browser) -> None:
    run_id, token = await env.waiting_for_approval()
    await browser.signin(env.viewer_key)  # may read the project, may not decide
    status, html, _ = await browser.get(f"/approvals/{run_id}/{token}")
    assert status == 200 and "Keep api at 3 replicas?" in html
    csrf = await browser.csrf(f"/approvals/{run_id}/{token}")
    status, html, _ = await browser.post(f"/approvals/{run_id}/{token}", {"csrf": csrf, "decision": "approve"})
    assert status == 403 and "no approver role" in html
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "WAITING_APPROVAL"
    # another project's run does not exist for this key
    other = await env.create(project="elsewhere")
    status, _, _ = await browser.get(f"/runs/{other}")
    assert status == 404
    status, _, _ = await browser.get("/projects/elsewhere/runs")
    assert status == 403


async def test_approval_link_decides_once_and_says_plainly_when_used_or_expired(
    env: ConsoleEnv, browser: Browser
) -> None:
    run_id, token = await env.waiting_for_approval()
    expired_id, expired_token = await env.waiting_for_approval()  # before the approval: a RESUMED run is claimable
    await browser.signin(env.approver_key)
    link = f"/approvals/{run_id}/{token}"
    # a wrong token for a waiting run: refused, nothing changes
    csrf = await browser.csrf(link)
    status, html, _ = await browser.post(f"/approvals/{run_id}/{'x' * 43}", {"csrf": csrf, "decision": "approve"})
    assert status == 409 and "not valid" in html
    status, _, r = await browser.post(
        link, {"csrf": csrf, "decision": "approve", "reason": "ok"}, allow_redirects=False
    )
    assert status == 303 and r.headers["Location"] == f"/runs/{run_id}?msg=approved"
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "RESUMED"
    status, html, _ = await browser.get(link)
    assert (
        status == 410
        and "already used: approver-amy approved the run" in html
        and "<form" not in html.split("<main>")[1].split("Journal so far")[0]
    )
    status, html, _ = await browser.post(link, {"csrf": csrf, "decision": "reject"})
    assert status == 409 and "not waiting for approval" in html

    await env.db.execute(
        "UPDATE awooop_run_state SET approval_expires_at = now() - interval '1 minute' WHERE run_id = $1", expired_id
    )
    status, html, _ = await browser.get(f"/approvals/{expired_id}/{expired_token}")
    assert status == 410 and "expired" in html
    status, html, _ = await browser.post(
        f"/approvals/{expired_id}/{expired_token}", {"csrf": csrf, "decision": "approve"}
    )
    assert status == 409 and "expired" in html
    # not signed in: the link survives the sign-in
    anon = aiohttp.ClientSession()
    try:
        async with anon.get(env.url + link, allow_redirects=False) as r:
            where = urlsplit(r.headers["Location"])
            assert r.status == 303 and where.path == "/signin" and parse_qs(where.query)["next"] == [link]
    finally:
        await anon.close()


async def test_payloads_are_escaped(env: ConsoleEnv, browser: Browser) -> None:
    attack = '<script>alert(1)</script><img src=x onerror="alert(2)">'
    run_id, _ = await env.waiting_for_approval(summary=attack, payload={"text": attack})
    await browser.signin(env.admin_key)
    for path in (f"/runs/{run_id}", "/projects/ops/approvals"):
        status, html, _ = await browser.get(path)
        assert status == 200
        assert "<script>alert" not in html and "<img src=x" not in html
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html


async def test_runs_page_counts_filters_searches_and_pages(env: ConsoleEnv, browser: Browser) -> None:
    ids = [await env.create() for _ in range(3)]
    await env.db.execute(
        """INSERT INTO awooop_run_state (project_id, channel_type, provider_event_id, created_at)
           SELECT 'ops', 'telegram', 'tg-' || g, now() - make_interval(mins => g) FROM generate_series(1, 60) g"""
    )
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get("/projects/ops/runs")
    assert status == 200 and "<b>63</b>" in html and "oldest claimable run" in html
    assert html.count('href="/runs/') == 50 and "next page" in html
    next_url = re.search(r'href="(\?[^"]*page_token=[^"]+)" rel="next"', html).group(1)  # type: ignore[union-attr]
    status, html, _ = await browser.get("/projects/ops/runs" + next_url.replace("&amp;", "&"))
    assert html.count('href="/runs/') == 13 and "first page" in html
    status, html, _ = await browser.get("/projects/ops/runs?channel=api")
    assert html.count('href="/runs/') == 3 and all(i in html for i in ids)
    status, html, _ = await browser.get("/projects/ops/runs?q=tg-7")
    assert html.count('href="/runs/') == 1 and "tg-7" in html
    status, _, r = await browser.get(f"/projects/ops/runs?q={ids[0]}", allow_redirects=False)
    assert status == 303 and r.headers["Location"] == f"/runs/{ids[0]}"
    status, html, _ = await browser.get("/projects/ops/runs?status=COMPLETED")
    assert "No runs match these filters" in html
    status, html, _ = await browser.get("/projects/ops/runs?since=yesterday")
    assert status == 200 and "is not a date" in html
    status, html, _ = await browser.get("/projects/ops/runs?since=2000-01-01&until=2000-01-02")
    assert "No runs match" in html


async def test_a_run_of_many_steps_is_paginated(env: ConsoleEnv, browser: Browser) -> None:
    run_id = await env.create()
    lease = await env.claim(run_id)
    for i in range(130):
        await env.scale_step(lease, f"step-{i:03d}")
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert status == 200 and html.count('<tr id="step-') == 100 and "page 1 of 2 (130 entries)" in html
    assert 'href="?st=2" rel="next"' in html
    status, html, _ = await browser.get(f"/runs/{run_id}?tl=1&st=2")
    assert html.count('<tr id="step-') == 30 and "step-129" in html
    assert 'href="?tl=1&amp;st=1"' in html  # the pager keeps the timeline's page
    assert "leased by worker console-test-worker" in html  # why it is not moving


async def test_the_run_page_lists_the_progress_events(env: ConsoleEnv, browser: Browser) -> None:
    from awooop.scheduler.v1 import scheduler_pb2
    from awooop.worker import to_struct

    run_id = await env.create()
    lease = await env.claim(run_id)
    for i, note in enumerate(("fetched <b>logs</b>", "summarised")):
        request = scheduler_pb2.EmitEventRequest(lease=lease, kind=f"stage-{i}", data=to_struct({"note": note}))
        await env.worker.call(env.worker.scheduler.EmitEvent, request)
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert status == 200 and html.count('<tr id="event-') == 2
    assert "stage-0" in html and "stage-1" in html and "summarised" in html
    assert "&lt;b&gt;logs&lt;/b&gt;" in html  # escaped like every payload
    assert "runs?parent=" not in html  # a run without children links to none
    other = await env.create()
    status, html, _ = await browser.get(f"/runs/{other}")
    assert status == 200 and "(none emitted)" in html


async def test_awooop_serve_console_is_a_real_process(env: ConsoleEnv, settings: Any, tmp_path: Any) -> None:
    import asyncio
    import os
    import signal
    import subprocess
    import sys
    import urllib.request

    from services.common.embedded import free_port
    from tests.harness.helpers import ROOT, eventually, settings_env

    port = free_port()
    child = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")} | settings_env(settings)
    child |= {
        "AWOOOP_CONSOLE_PORT": str(port),
        "AWOOOP_CONSOLE_SCHEDULER_ADDR": env.addr("scheduler"),
        "AWOOOP_CONSOLE_SAGA_ADDR": env.addr("saga"),
        "AWOOOP_METRICS_PORT": "0",
    }
    log = open(tmp_path / "console.log", "wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "awooop.cli", "serve", "console"], env=child, cwd=ROOT, stdout=log, stderr=log
    )
    try:

        async def up() -> bool:
            assert proc.poll() is None, (tmp_path / "console.log").read_text()
            try:
                with await asyncio.to_thread(urllib.request.urlopen, f"http://127.0.0.1:{port}/healthz", timeout=2):
                    return True
            except OSError:
                return False

        await eventually(up, timeout=30, what="awooop serve console")
        other = Browser(f"http://127.0.0.1:{port}")
        await env.create()  # a project the console knows
        try:
            status, _, _ = await other.signin(env.admin_key)
            assert status == 303
            status, html, _ = await other.get("/projects/ops/runs")
            assert status == 200 and "Runs of ops" in html
        finally:
            await other.close()
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        log.close()


async def test_run_page_says_why_it_waits_and_links_the_trace(start_services: Any, make_key: Any, db: Any) -> None:
    env = await start_console_env(
        start_services, make_key, db, console_trace_url="https://traces.example/search?run={run_id}"
    )
    b = Browser(env.url)
    try:
        run_id, _ = await env.waiting_for_approval(summary="Drain node-7?")
        await b.signin(env.admin_key)
        status, html, _ = await b.get(f"/runs/{run_id}")
        assert status == 200
        assert f'href="https://traces.example/search?run={run_id}"' in html
        assert "waiting for a human decision on: Drain node-7? (token expires in" in html
        queued = await env.create()
        await env.db.execute(
            "UPDATE awooop_run_state SET not_before = now() + interval '90 seconds' WHERE run_id = $1", queued
        )
        _, html, _ = await b.get(f"/runs/{queued}")
        assert "in retry backoff: claimable in" in html
    finally:
        await b.close()
        await stop_console_env(env)


async def test_decide_from_the_approvals_page_and_resolve_a_failed_compensation_by_hand(
    env: ConsoleEnv, browser: Browser
) -> None:
    failed_id = await env.failed_compensation()  # first: an approved run (RESUMED) is claimable again
    await env.db.execute("DELETE FROM awooop_refgw_fault")
    run_id, token = await env.waiting_for_approval(summary="Restart the payment workers?")
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get("/projects/ops/approvals")
    assert status == 200 and f'id="approval-{run_id}"' in html and "Restart the payment workers?" in html
    assert token not in html  # the token is never shown; the approver pastes it
    csrf = await browser.csrf("/projects/ops/approvals")
    status, _, r = await browser.post(
        f"/runs/{run_id}/decide",
        {"csrf": csrf, "approval_token": token, "decision": "approve", "reason": "load confirmed"},
        allow_redirects=False,
    )
    assert status == 303 and r.headers["Location"] == f"/runs/{run_id}?msg=approved"
    _, html, _ = await browser.get(f"/runs/{run_id}?msg=approved")
    assert "Approved: the run is RESUMED" in html and "APPROVED" in html and "load confirmed" in html

    status, html, _ = await browser.get("/projects/ops/compensations")
    assert f'id="comp-{failed_id}"' in html and "api down: 503 from the cluster" in html
    # the saga requires a reason: its INVALID_ARGUMENT comes back as a page, nothing changes
    status, html, _ = await browser.post(
        f"/runs/{failed_id}/compensation/resolve", {"csrf": csrf, "step_id": "scale", "reason": ""}
    )
    assert status == 400 and "reason" in html
    assert await env.saga_status(failed_id) == "compensation_failed"
    status, _, r = await browser.post(
        f"/runs/{failed_id}/compensation/resolve",
        {"csrf": csrf, "step_id": "scale", "reason": "scaled back by hand with kubectl"},
        allow_redirects=False,
    )
    assert status == 303 and r.headers["Location"] == f"/runs/{failed_id}?msg=resolved"
    assert await env.saga_status(failed_id) == "compensated"
    _, html, _ = await browser.get(f"/runs/{failed_id}")
    assert "SAGA_COMPENSATION_RESOLVED" in html and "resolved by oncall-lead: scaled back by hand with kubectl" in html
    _, html, _ = await browser.get("/projects/ops/compensations")
    assert f'id="comp-{failed_id}"' not in html


async def test_an_approver_completes_or_expires_a_parked_runs_wait_from_the_run_page(
    env: ConsoleEnv, browser: Browser
) -> None:
    run_id, wait_id = await env.parked_on_wait()
    sleeping = await env.parked_on_wait(scheduler_pb2.WAIT_KIND_SLEEP)  # parked before the first resumes
    # a key without the approver role sees the wait and its forms; the scheduler refuses the expiry
    await browser.signin(env.viewer_key)
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert status == 200 and 'id="waits"' in html and wait_id in html and "Expire deploy-done" in html
    csrf = await browser.csrf(f"/runs/{run_id}")
    status, html, _ = await browser.post(f"/runs/{run_id}/waits/{wait_id}/expire", {"csrf": csrf})
    assert status == 403 and "no approver role" in html
    assert await env.db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", wait_id) == "open"
    path = f"/runs/{run_id}/waits/{wait_id}/complete"
    status, _, _ = await browser.post(path, {"result": "{}"}, allow_redirects=False)
    assert status == 403  # no CSRF token: refused before the scheduler is asked

    browser = Browser(env.url)  # a second operator, at their own browser
    try:
        await _approver_ends_waits(env, browser, run_id, wait_id, sleeping)
    finally:
        await browser.close()


async def _approver_ends_waits(
    env: ConsoleEnv, browser: Browser, run_id: str, wait_id: str, sleeping: tuple[str, str]
) -> None:
    complete = f"/runs/{run_id}/waits/{wait_id}/complete"
    await browser.signin(env.approver_key)
    csrf = await browser.csrf(f"/runs/{run_id}")
    status, html, _ = await browser.post(complete, {"csrf": csrf, "result": "[1, 2]"})
    assert status == 400 and "must be a JSON object" in html
    status, html, _ = await browser.post(complete, {"csrf": csrf, "result": '{"deployed": "v42"}'})
    assert status == 200 and "Wait completed by hand" in html and 'id="waits"' not in html
    row = await env.db.fetchrow("SELECT status, result, completed_by FROM awooop_wait WHERE wait_id = $1", wait_id)
    assert (row["status"], json.loads(row["result"]), row["completed_by"]) == (
        "completed", {"deployed": "v42"}, "user:approver-amy"
    )  # fmt: skip
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "PENDING"
    audit = await env.db.fetchrow(
        "SELECT actor, action FROM awooop_audit_log WHERE run_id = $1 ORDER BY audit_id DESC LIMIT 1", run_id
    )
    assert (audit["actor"], audit["action"]) == ("user:approver-amy", "WAIT_COMPLETED")
    status, html, _ = await browser.post(complete, {"csrf": csrf, "result": "{}"})
    assert status == 409 and "already ended (completed)" in html

    # a sleep has no Complete form, only Expire; expiring it wakes the run now
    run_id, wait_id = sleeping
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert "Expire deploy-done" in html and "Complete deploy-done" not in html
    status, html, _ = await browser.post(f"/runs/{run_id}/waits/{wait_id}/expire", {"csrf": csrf})
    assert status == 200 and "Wait expired by hand" in html
    assert await env.db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1", wait_id) == "timed_out"
    status, _, _ = await browser.post(f"/runs/{run_id}/waits/not-a-uuid/expire", {"csrf": csrf})
    assert status == 404


async def test_invalid_utf8_and_huge_inputs_are_no_session_or_4xx_never_500(env: ConsoleEnv, browser: Browser) -> None:
    """What an ordinary client will not send, written byte by byte: cookies, forms, query strings
    and path segments that are not UTF-8 (or are huge). A cookie that is not ours is no session
    (the sign-in redirect); other bad input is a 4xx page; nothing answers 500."""
    port = env.console.port
    run_id = await env.create()

    async def raw(method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes = b"") -> int:
        answer = await rawhttp.request(port, method, target, headers, body)
        assert answer.status < 500, (method, target[:80], headers, body[:80], answer.status, answer.body[:200])
        return answer.status

    bad = b"\xff\xfe"
    # no session yet: a bad cookie is no cookie
    for cookie in (b"awooop_console=" + bad, b"awooop_console=" + b"\xed\xa0\x80", b"awooop_console=" + b"A" * 4000,
                   b"awooop_console=\"" + bad, b"awooop_console=%FF%FE", bad + b"=" + bad):  # fmt: skip
        assert await raw("GET", b"/projects/ops/runs", [(b"Cookie", cookie)]) == 303
        assert await raw("GET", b"/signin", [(b"Cookie", cookie)]) == 200
    # the sign-in form with a bad double-submit cookie, and with a body that is not UTF-8
    form = b"application/x-www-form-urlencoded"
    assert await raw("POST", b"/signin", [(b"Cookie", b"awooop_console_signin=" + bad), (b"Content-Type", form)],
                     b"csrf=x&api_key=k") == 403  # fmt: skip
    token = await browser.csrf("/signin")
    signin_cookie = next(c.value for c in browser.http.cookie_jar if c.key == "awooop_console_signin").encode()
    for body in (b"csrf=" + token.encode() + b"&api_key=" + bad, b"api_key=" + bad + b"&csrf=" + token.encode()):
        status = await raw("POST", b"/signin", [(b"Cookie", b"awooop_console_signin=" + signin_cookie),
                                                (b"Content-Type", form)], body)  # fmt: skip
        assert status == 400
    # a key that is valid text but not a key's shape (not ASCII) is simply not accepted
    for key in ("awk_é_x", "awk_x_\u3000", "ключ"):
        status, html, _ = await browser.post(
            "/signin", {"csrf": await browser.csrf("/signin"), "api_key": key, "next": "/"}, allow_redirects=False
        )
        assert status == 401 and "not accepted" in html, key

    # signed in: a good session cookie next to bad bytes elsewhere
    await browser.signin(env.admin_key)
    session = browser.session_cookie().encode()
    csrf = (await browser.csrf(f"/runs/{run_id}")).encode()
    cookie = (b"Cookie", b"awooop_console=" + session)
    assert await raw("GET", b"/projects/ops/runs", [cookie]) == 200
    for target in (
        b"/projects/ops/runs?q=%FF%FE",
        b"/projects/ops/runs?q=%ED%A0%80&status=%FF&channel=%FF",
        b"/projects/ops/runs?since=%FF&until=99999-99-99",
        b"/projects/ops/runs?q=%00",
        b"/projects/ops/runs?page_token=%FF%FE",
        b"/projects/ops/runs?q=" + b"x" * 7000,
        b"/projects/%FF%FE/runs",
        b"/projects/" + b"p" * 5000 + b"/runs",
        b"/projects/%FF/approvals",
        b"/projects/%FF/compensations",
        b"/runs/%FF%FE",
        b"/runs/" + b"%D9%A0" * 32,  # 32 Arabic-Indic zeros: int() reads them as a UUID's hex digits
        b"/runs/" + run_id.encode() + b"?tl=%FF&st=" + b"9" * 5000,
        b"/approvals/%FF/%FE",
        b"/approvals/" + b"%D9%A0" * 32 + b"/%FF",
        b"/" + b"x" * 9000,
    ):
        await raw("GET", target, [cookie])
    # forms of a session: a body that is not UTF-8 is 400 before any handler; huge is 413
    for path in (f"/runs/{run_id}/cancel", f"/runs/{run_id}/decide", f"/runs/{run_id}/compensation/resolve"):
        for body in (b"csrf=" + csrf + b"&reason=" + bad, b"csrf=" + csrf + b"&reason=" + b"r" * 70_000):
            status = await raw("POST", path.encode(), [cookie, (b"Content-Type", form)], body)
            assert status in (400, 413), (path, status)
        # valid text the services refuse (NUL) or take (non-ASCII) is their answer, not a 500
        await raw("POST", path.encode(), [cookie, (b"Content-Type", form)],
                  b"csrf=" + csrf + b"&step_id=%00&approval_token=%00&decision=approve&reason=%E2%9C%93")  # fmt: skip
    assert await raw("POST", b"/approvals/%FF/%FE", [cookie, (b"Content-Type", form)], b"csrf=" + csrf) == 404
    assert await raw("GET", f"/runs/{run_id}".encode(), [cookie, (b"Origin", bad), (b"Referer", bad)]) == 200
    assert await raw("POST", b"/signout", [cookie, (b"Origin", bad), (b"Content-Type", form)], b"csrf=" + csrf) == 403


async def test_next_after_sign_in_is_only_a_same_origin_path(env: ConsoleEnv, browser: Browser) -> None:
    """The approval link's sign-in page must not become an open redirect: browsers drop tab and
    newline from a URL and read a backslash as a slash, so all of these would leave the console."""
    hostile = [
        "//evil.example", "/\t/evil.example", "/\n/evil.example", "/\r\n/evil.example", "/\\evil.example",
        "/\\/evil.example", "\\/evil.example", "/ /evil.example", " //evil.example", "/\x00/evil.example",
        "/\x0b/evil.example", "/\x7f/evil.example", "/\u3000/evil.example", "/\u2028/evil.example",
        "/\ufeff/evil.example", "https://evil.example", "http:/evil.example", "javascript:alert(1)",
        "evil.example", "//", "///evil.example", "", "./runs", "?next=x", "/runs\\..\\..\\evil.example",
    ]  # fmt: skip
    fine = ["/", "/projects/ops/runs?status=FAILED&q=a%20b", f"/approvals/{uuid.uuid4()}/tok-en_1", "/runs/x#frag"]
    for target in hostile + fine:
        expected = target if target in fine else "/"
        status, html, _ = await browser.get("/signin?" + urlencode({"next": target}))
        m = re.search(r'name="next" value="([^"]*)"', html)
        assert status == 200 and m and html_lib.unescape(m.group(1)) == expected, (target, m and m.group(1))
    # a mistyped key keeps the way back (the approval link), and still only a same-origin one
    for target, expected in (("/projects/ops/runs", "/projects/ops/runs"), ("/\t/evil.example", "/")):
        token = await browser.csrf("/signin")
        status, html, _ = await browser.post(
            "/signin", {"csrf": token, "api_key": "awk_typo_typo", "next": target}, allow_redirects=False
        )
        assert status == 401 and f'name="next" value="{expected}"' in html, target
    # the form's own `next` is checked again when it is posted (it can be forged)
    for target, expected in (("/\t/evil.example", "/"), ("//evil.example", "/"), ("/projects/ops/runs",) * 2):
        fresh = Browser(env.url)  # not signed in: the sign-in page's only form is the sign-in form
        try:
            token = await fresh.csrf("/signin")
            status, _, r = await fresh.post(
                "/signin", {"csrf": token, "api_key": env.admin_key, "next": target}, allow_redirects=False
            )
        finally:
            await fresh.close()
        assert status == 303 and r.headers["Location"] == expected, target


async def test_a_newcomers_wrong_turns_get_a_styled_page_that_says_what_happened(
    env: ConsoleEnv, browser: Browser
) -> None:
    """A failed run says what is left of it (not why it is "waiting"); a mistyped run id, an
    unknown run and an unknown project answer 404 as console pages in plain words."""
    await browser.signin(env.admin_key)
    failed_id = await env.failed_compensation()
    status, html, _ = await browser.get(f"/runs/{failed_id}")
    assert status == 200
    assert "Why it is waiting" not in html
    assert "<b>Compensation:</b> a compensation failed: retry it or resolve it by hand" in html
    await env.db.execute("DELETE FROM awooop_refgw_fault")

    for path in ("/runs/not-a-uuid", "/approvals/not-a-uuid/token"):
        status, html, r = await browser.get(path)
        assert status == 404 and r.content_type == "text/html", (path, html)
        assert '<link rel="stylesheet"' in html and "No such" in html and "is a UUID" in html, html

    missing = "00000000-0000-0000-0000-000000000000"
    status, html, _ = await browser.get(f"/runs/{missing}")
    assert status == 404 and "NOT_FOUND NOT_FOUND" not in html
    assert "<h1>Not found</h1>" in html and f"run {missing} not found" in html, html

    status, html, _ = await browser.get("/projects/no-such-project/runs")
    assert status == 404, html
    assert "No project named &#39;no-such-project&#39; has runs, and none of your roles names it" in html, html
    assert "Projects you can see: ops." in html, html
    # a known project with nothing matching a filter is still an empty, successful page
    status, html, _ = await browser.get("/projects/ops/runs?status=CANCELLED")
    assert status == 200 and "No runs match these filters." in html


async def test_an_approval_link_with_a_made_up_token_shows_no_form(env: ConsoleEnv, browser: Browser) -> None:
    """The link's token is checked (DecideApproval validate_only: nothing decided) before the
    Approve/Reject form is shown; the real link still shows it and still decides."""
    run_id, token = await env.waiting_for_approval()
    await browser.signin(env.approver_key)
    for made_up in ("x" * 43, "not a token at all"):
        status, html, _ = await browser.get(f"/approvals/{run_id}/{made_up}")
        main = html.split("<main>")[1].split("Journal so far")[0]
        assert status == 410 and "token is not the run" in html and "<form" not in main, html
    assert await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "WAITING_APPROVAL"
    status, html, _ = await browser.get(f"/approvals/{run_id}/{token}")
    assert status == 200 and 'value="approve"' in html
    csrf = await browser.csrf(f"/approvals/{run_id}/{token}")
    status, _, _ = await browser.post(
        f"/approvals/{run_id}/{token}", {"csrf": csrf, "decision": "approve"}, allow_redirects=False
    )
    assert (
        status == 303
        and await env.db.fetchval("SELECT status FROM awooop_run_state WHERE run_id = $1", run_id) == "RESUMED"
    )


async def test_the_run_page_links_a_parent_and_its_children(env: ConsoleEnv, browser: Browser) -> None:
    parent = await env.create()
    lease = await env.claim(parent)
    specs = [scheduler_pb2.ChildRunSpec(step_id=f"sub-{i}", input=to_struct({"i": i})) for i in range(2)]
    started = await env.worker.call(
        env.worker.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=lease, children=specs)
    )
    kids = [c.run_id for c in started.children]
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get(f"/runs/{parent}")
    assert status == 200 and 'id="tree"' in html
    assert all(f'href="/runs/{k}"' in html for k in kids) and "sub-0" in html and "sub-1" in html
    project = await env.db.fetchval("SELECT project_id FROM awooop_run_state WHERE run_id = $1", parent)
    children_list = f"/projects/{project}/runs?parent={parent}"
    assert html.count(f'href="{children_list}"') == 1  # the children in the runs list, to filter
    status, html, _ = await browser.get(f"/runs/{kids[1]}")
    assert status == 200 and f'href="/runs/{parent}"' in html and "step sub-1, depth 1" in html
    # the runs list of the parent's children: both, not the parent; with a status filter, the one
    # that failed
    await env.db.execute("UPDATE awooop_run_state SET status = 'FAILED' WHERE run_id = $1", kids[0])
    status, html, _ = await browser.get(children_list)
    rows = html.split("<tbody>")[1]
    assert status == 200 and "Children of run" in html
    assert all(f'href="/runs/{k}"' in rows for k in kids) and f'href="/runs/{parent}"' not in rows
    status, html, _ = await browser.get(f"{children_list}&status=FAILED")
    rows = html.split("<tbody>")[1]
    assert status == 200 and f'href="/runs/{kids[0]}"' in rows and f'href="/runs/{kids[1]}"' not in rows
    status, html, _ = await browser.get(f"/projects/{project}/runs?parent=not-a-run")
    assert status == 200 and "is not a run id" in html
    # the counts are the children's: the parent (RUNNING) is not among them
    status, html, _ = await browser.get(children_list)
    counts = html.split('class="counts"')[1].split("</section>")[0]
    assert "<span>children</span> <b>2</b>" in counts and "status-running" not in counts, counts
    assert f"?parent={parent}&amp;status=FAILED" in counts  # a count filters the children
    # a run nobody has: said so; the children of a run of another project: listed in its project
    status, html, _ = await browser.get(f"/projects/{project}/runs?parent={uuid.uuid4()}")
    assert status == 200 and "no run" in html and "in your projects" in html
    status, _, r = await browser.get(f"/projects/elsewhere/runs?parent={parent}", allow_redirects=False)
    assert status == 303 and r.headers["Location"] == f"/projects/{project}/runs?parent={parent}"


async def test_the_schedules_page_lists_next_ticks_and_failures_and_an_admin_deletes_one(
    env: ConsoleEnv, browser: Browser
) -> None:
    """A project's schedules as `awooop flow schedules` shows them; a failed tick's error is on the
    page; Delete is the scheduler's DeleteSchedule, so a viewer is refused there and an admin not."""
    for name, cron, tz in (("nightly<report>", "0 3 * * *", "Europe/Berlin"), ("every-minute", "* * * * *", "")):
        await env.admin.call(
            env.admin.scheduler.SetSchedule,
            scheduler_pb2.SetScheduleRequest(
                schedule=scheduler_pb2.Schedule(
                    project_id="ops", name=name, cron=cron, time_zone=tz, input=to_struct({"report": "<b>daily</b>"})
                )
            ),
        )
    # a tick that failed (the scheduler's loop keeps the error on the schedule and retries later)
    await env.db.execute(
        "UPDATE awooop_schedule SET last_error = 'input too large', last_error_at = now()"
        " WHERE project_id = 'ops' AND name = 'every-minute'"
    )
    await browser.signin(env.viewer_key)
    status, html, _ = await browser.get("/projects/ops/schedules")
    assert status == 200
    assert "<code>nightly&lt;report&gt;</code>" in html and "Europe/Berlin" in html and "0 3 * * *" in html
    assert "&lt;b&gt;daily&lt;/b&gt;" in html and "<b>daily</b>" not in html
    assert "input too large (at " in html
    assert 'href="/projects/ops/schedules"' in html  # in the project's navigation
    csrf = await browser.csrf("/projects/ops/schedules")
    status, html, _ = await browser.post("/projects/ops/schedules/delete", {"csrf": csrf, "name": "every-minute"})
    assert status == 403 and "admin" in html
    assert await env.db.fetchval("SELECT count(*) FROM awooop_schedule WHERE project_id = 'ops'") == 2

    await browser.http.close()
    admin = Browser(env.url)
    try:
        await admin.signin(env.admin_key)
        csrf = await admin.csrf("/projects/ops/schedules")
        status, _, r = await admin.post(
            "/projects/ops/schedules/delete", {"csrf": csrf, "name": "every-minute"}, allow_redirects=False
        )
        assert status == 303 and r.headers["Location"] == "/projects/ops/schedules?msg=unscheduled"
        _, html, _ = await admin.get("/projects/ops/schedules?msg=unscheduled")
        assert "Schedule deleted" in html and "every-minute" not in html and "nightly&lt;report&gt;" in html
        names = await env.db.fetch("SELECT name FROM awooop_schedule WHERE project_id = 'ops'")
        assert [r["name"] for r in names] == ["nightly<report>"]
        # another project's schedules are the scheduler's to refuse too
        status, _, _ = await admin.get("/projects/elsewhere/schedules")
        assert status == 200  # the admin key is an admin of every project ("*")
    finally:
        await admin.close()


async def test_the_workers_page_lists_labels_and_a_run_page_says_why_a_labelled_run_waits(
    env: ConsoleEnv, browser: Browser
) -> None:
    """The Workers page lists the workers whose claims came, with their labels, as `awooop workers
    list`; a run that requires labels no live worker has shows them and why it waits."""
    from tests.harness import rpc_runs
    from tests.harness.helpers import eventually

    await env.worker.call(
        env.worker.scheduler.ClaimRuns,
        scheduler_pb2.ClaimRunsRequest(worker_id="gpu<1>", project_ids=["ops"], labels={"gpu": "a100"}),
    )
    (run_id,) = await rpc_runs.ingest_runs(env.admin, "ops", [{}], required_labels={"gpu": "h100"})
    await browser.signin(env.viewer_key)
    status, html, _ = await browser.get("/projects/ops/workers")
    assert status == 200 and 'href="/projects/ops/workers"' in html
    assert "<code>gpu&lt;1&gt;</code>" in html and "<code>gpu=a100</code>" in html and ">live<" in html

    async def says_why() -> bool:
        _, page, _ = await browser.get(f"/runs/{run_id}")
        return "no live worker has the labels it requires (gpu=h100)" in page

    await eventually(says_why, timeout=30, what="the label sweep parked the run, its page says why")
    _, page, _ = await browser.get(f"/runs/{run_id}")
    assert "requires labels" in page and "gpu=h100" in page


async def test_the_run_page_shows_the_streamed_output_and_reloads_while_it_streams(
    env: ConsoleEnv, browser: Browser
) -> None:
    """Tokens a run streams (PublishTokens): the checkpointed ones and the live tail past the last
    checkpoint, as one text per stream and attempt; the page reloads itself while the run
    streams, and not once it ended. Checkpoint rows are not listed as progress events."""
    from awooop.common.v1 import common_pb2
    from awooop.scheduler.v1 import scheduler_pb2

    run_id = await env.create()
    lease = await env.claim(run_id)

    async def publish(first: int, tokens: list[str], checkpoint: bool = False) -> None:
        request = scheduler_pb2.PublishTokensRequest(lease=lease, first_seq=first, tokens=tokens, checkpoint=checkpoint)
        await env.worker.call(env.worker.scheduler.PublishTokens, request)

    await publish(1, ["The ", "<b>cause</b> "], checkpoint=True)
    await publish(3, ["is ", "cpu"])  # live only: past the last checkpoint
    await browser.signin(env.admin_key)
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert status == 200 and "Streamed output" in html
    assert "The &lt;b&gt;cause&lt;/b&gt; is cpu</pre>" in html and "attempt 1, 4 tokens" in html
    assert '<meta http-equiv="refresh" content="2">' in html
    assert "stream_checkpoint" not in html and "(none emitted)" in html
    await publish(1, ["The ", "<b>cause</b> ", "is ", "cpu"], checkpoint=True)
    complete = scheduler_pb2.CompleteRunRequest(lease=lease)
    ended = await env.worker.call(env.worker.scheduler.CompleteRun, complete)
    assert ended.run.status == common_pb2.RUN_STATUS_COMPLETED
    status, html, _ = await browser.get(f"/runs/{run_id}")
    assert "The &lt;b&gt;cause&lt;/b&gt; is cpu</pre>" in html and 'http-equiv="refresh"' not in html


async def test_the_debounce_page_shows_the_rules_and_an_admin_sets_and_deletes_one(
    env: ConsoleEnv, browser: Browser
) -> None:
    """A project's debounce rules as `awooop flow debounces` shows them; the form is the
    scheduler's SetDebounceRule (a viewer refused, a bad key expression answered field by field),
    Delete its DeleteDebounceRule."""
    await browser.signin(env.viewer_key)
    status, html, _ = await browser.get("/projects/ops/debounce")
    assert status == 200 and "No debounce rule" in html and 'href="/projects/ops/debounce"' in html
    csrf = await browser.csrf("/projects/ops/debounce")
    form = {
        "csrf": csrf,
        "channel": "telegram",
        "key": "message.chat.id",
        "window": "30",
        "max_wait": "",
        "mode": "last",
    }
    status, html, _ = await browser.post("/projects/ops/debounce", form)
    assert status == 403 and "admin" in html
    await browser.http.close()
    admin = Browser(env.url)
    try:
        await admin.signin(env.admin_key)
        csrf = await admin.csrf("/projects/ops/debounce")
        status, _, r = await admin.post("/projects/ops/debounce", {**form, "csrf": csrf}, allow_redirects=False)
        assert status == 303 and r.headers["Location"] == "/projects/ops/debounce?msg=debounce_set"
        _, html, _ = await admin.get("/projects/ops/debounce?msg=debounce_set")
        assert "Debounce rule set" in html and "<code>message.chat.id</code>" in html and "300s" in html
        assert "last events" in html
        status, html, _ = await admin.post("/projects/ops/debounce", {**form, "csrf": csrf, "key": "a..b"})
        assert status == 400 and "rule.key_expression" in html
        status, _, r = await admin.post(
            "/projects/ops/debounce/delete", {"csrf": csrf, "channel": "telegram"}, allow_redirects=False
        )
        assert status == 303 and r.headers["Location"] == "/projects/ops/debounce?msg=debounce_deleted"
        assert await env.db.fetchval("SELECT count(*) FROM awooop_debounce_rule WHERE project_id = 'ops'") == 0
        actions = await env.db.fetch(
            "SELECT action FROM awooop_audit_log WHERE project_id = 'ops' AND action LIKE 'DEBOUNCE%' ORDER BY audit_id"
        )
        assert [a["action"] for a in actions] == ["DEBOUNCE_RULE_SET", "DEBOUNCE_RULE_DELETED"]
    finally:
        await admin.close()
