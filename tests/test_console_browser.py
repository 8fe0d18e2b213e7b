"""The operator console in a real browser: Debian's chromium driven by Playwright (never a
downloaded browser), against the real services, the real `awooop demo` (whose worker process
is SIGKILLed mid-run) and real Postgres/Redis.

Set CONSOLE_SCREENSHOT=docs/console.png to refresh the documentation's screenshot of the run page.

Written for Debian 12's chromium (156 when written; .ci/install-debian prints the version) driven by
the locked Playwright (uv.lock) over CDP, which Playwright keeps compatible with current Chromium."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import pytest_asyncio

from tests.harness.console import ROOT, ConsoleEnv, start_console_env, stop_console_env

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
WAIT_MS = 30_000  # bound of every wait for something to appear (a failing test stops here)

os.environ.setdefault("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")


@pytest_asyncio.fixture(loop_scope="session")
async def env(start_services: Any, make_key: Any, db: Any) -> AsyncIterator[ConsoleEnv]:
    e = await start_console_env(start_services, make_key, db)
    yield e
    await stop_console_env(e)


@pytest_asyncio.fixture(loop_scope="session")
async def page() -> AsyncIterator[Any]:
    if not CHROMIUM:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is not installed: .ci/install-debian must run before the tests")
        pytest.skip("chromium is not installed (apt-get install chromium, or .ci/install-debian)")
    from playwright.async_api import async_playwright, expect

    expect.set_options(timeout=WAIT_MS)  # a slow CI machine waits longer; a failing test still stops
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM)
        context = await browser.new_context(viewport={"width": 1440, "height": 900})
        pg = await context.new_page()
        pg.set_default_timeout(WAIT_MS)
        dialogs: list[str] = []
        pg.on("dialog", lambda d: dialogs.append(d.message))
        pg.dialogs = dialogs  # type: ignore[attr-defined]  # what the tests assert stayed empty
        yield pg
        await browser.close()


async def sign_in(page: Any, key: str) -> None:
    await page.fill("input[name=api_key]", key)
    await page.click("form.signin button[type=submit]")
    await page.wait_for_load_state()


async def test_the_demo_run_its_crash_skipped_steps_rejection_and_compensation_on_one_page(
    env: ConsoleEnv, page: Any, tmp_path: Path
) -> None:
    from playwright.async_api import expect

    summary = await env.run_demo("demo", tmp_path)
    run_id = summary["run_id"]

    await page.goto(env.url)
    await expect(page.locator("h1")).to_have_text("Sign in")
    await sign_in(page, env.admin_key)
    # the dev-style key is admin everywhere: the projects with runs are listed
    if await page.locator("ul.projects").count():
        await page.click("ul.projects >> text=demo")
    await expect(page.locator("h1")).to_have_text("Runs of demo")
    await expect(page.locator(".counts")).to_contain_text("FAILED 1")
    await page.click(f"a[href='/runs/{run_id}']")
    await expect(page.locator("h1")).to_contain_text(run_id)

    timeline = page.locator("#timeline")
    await expect(timeline).to_contain_text("REAPED")  # the SIGKILLed worker's lease, taken back
    await expect(timeline).to_contain_text("APPROVAL_REJECTED")
    await expect(timeline).to_contain_text("demo: the on-call lead says no")
    await expect(timeline).to_contain_text("compensation -> compensated")
    journal = page.locator("#journal")
    await expect(journal.locator("#step-1")).to_contain_text("diagnose")
    await expect(journal.locator("#step-1")).to_contain_text("skipped by later attempts")
    await expect(journal.locator("#step-2")).to_contain_text("compensated")
    await expect(journal.locator("#step-2")).to_contain_text("k8s_scale_deployment")
    await expect(page.locator("dl.fields")).to_contain_text("E-APPROVAL-REJECTED")
    await expect(page.locator("dl.fields")).to_contain_text("2 of 3")  # attempts: the crash cost one

    shot = tmp_path / "console.png"
    await page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    if os.environ.get("CONSOLE_SCREENSHOT"):
        shutil.copy(shot, ROOT / os.environ["CONSOLE_SCREENSHOT"])
    assert not page.dialogs


async def test_reject_from_an_approval_link_then_retry_a_failed_compensation(env: ConsoleEnv, page: Any) -> None:
    from playwright.async_api import expect

    run_id, token = await env.waiting_for_approval(summary="Scale api to 3 replicas during the incident?")
    link = f"{env.url}/approvals/{run_id}/{token}"

    # the link a bot sent: sign in first, then straight back to the approval
    await page.goto(link)
    await expect(page.locator("h1")).to_have_text("Sign in")
    await sign_in(page, env.approver_key)
    await expect(page.locator("#question")).to_have_text("Scale api to 3 replicas during the incident?")
    await expect(page.locator("table.journal")).to_contain_text("k8s_scale_deployment")
    await page.fill("form.decide input[name=reason]", "too risky at peak traffic")
    await page.click("form.decide button[value=reject]")

    # the run page: rejected, and the compensation appears as the saga runs it (the page reloads itself)
    await expect(page.locator(".flash")).to_contain_text("Rejected")
    timeline = page.locator("#timeline")
    await expect(timeline).to_contain_text("APPROVAL_REJECTED")
    await expect(timeline).to_contain_text("too risky at peak traffic")
    await expect(timeline).to_contain_text("compensation -> compensated", timeout=WAIT_MS)
    assert await env.saga_status(run_id) == "compensated"

    # the same link again says plainly that it was used
    await page.goto(link)
    await expect(page.locator("#link-state")).to_contain_text("already used: approver-amy rejected the run")

    await page.click("header button:has-text('Sign out')")
    await expect(page.locator(".flash")).to_have_text("Signed out.")

    # a compensation that fails at the cluster, then is retried by the on-call admin
    failed_id = await env.failed_compensation()
    await page.goto(f"{env.url}/projects/ops/compensations")
    await sign_in(page, env.admin_key)
    section = page.locator(f"#comp-{failed_id}")
    await expect(section).to_contain_text("api down: 503 from the cluster")
    await env.db.execute("DELETE FROM awooop_refgw_fault")  # the cluster is back
    await section.locator("button:has-text('Retry scale')").click()
    await expect(page.locator(".flash")).to_contain_text("Compensation retry scheduled")
    await expect(page.locator("#timeline")).to_contain_text("SAGA_COMPENSATION_RETRY")
    await expect(page.locator("#journal #step-1")).to_contain_text("compensated", timeout=WAIT_MS)
    await expect(page.locator("#journal #step-1 .step-status")).to_have_text("compensated")
    assert await env.saga_status(failed_id) == "compensated"
    assert not page.dialogs


async def test_an_approver_completes_one_parked_runs_wait_and_expires_anothers_by_button(
    env: ConsoleEnv, page: Any
) -> None:
    from playwright.async_api import expect

    done_id, done_wait = await env.parked_on_wait()
    expired_id, expired_wait = await env.parked_on_wait()
    await page.goto(f"{env.url}/runs/{done_id}")
    await sign_in(page, env.approver_key)
    await page.goto(f"{env.url}/runs/{done_id}")
    wait = page.locator(f"#wait-{done_wait}")
    await expect(wait).to_contain_text("deploy-done (token) open until")
    await wait.locator("input[name=result]").fill('{"deployed": "v42"}')
    await wait.locator("button:has-text('Complete deploy-done')").click()
    await expect(page.locator(".flash")).to_contain_text("Wait completed by hand")
    await expect(page.locator("#timeline")).to_contain_text("WAIT_COMPLETED")
    await expect(page.locator("#waits")).to_have_count(0)

    await page.goto(f"{env.url}/runs/{expired_id}")
    await page.locator(f"#wait-{expired_wait} button:has-text('Expire deploy-done')").click()
    await expect(page.locator(".flash")).to_contain_text("Wait expired by hand")
    await expect(page.locator("#timeline")).to_contain_text("WAIT_TIMED_OUT")
    statuses = await env.db.fetch(
        "SELECT wait_id::text, status, completed_by FROM awooop_wait WHERE wait_id = ANY($1::uuid[])",
        [done_wait, expired_wait],
    )
    assert {(r["wait_id"], r["status"], r["completed_by"]) for r in statuses} == {
        (done_wait, "completed", "user:approver-amy"),
        (expired_wait, "timed_out", "user:approver-amy"),
    }
    assert not page.dialogs


async def test_a_script_in_a_payload_renders_as_text(env: ConsoleEnv, page: Any) -> None:
    from playwright.async_api import expect

    attack = "<script>window.__xss=1;alert(1)</script><img src=x onerror='window.__xss=2;alert(2)'>"
    run_id, _ = await env.waiting_for_approval(summary=attack, payload={"message": {"text": attack}})
    await page.goto(f"{env.url}/runs/{run_id}")
    await sign_in(page, env.admin_key)
    await expect(page.locator("#input")).to_contain_text(attack)  # shown, as text
    await expect(page.locator("dl.fields")).to_contain_text(attack)
    assert await page.locator("img").count() == 0
    assert await page.locator("main script").count() == 0
    assert await page.evaluate("typeof window.__xss") == "undefined"
    await page.goto(f"{env.url}/projects/ops/approvals")
    await expect(page.locator(f"#approval-{run_id} .question")).to_have_text(attack)
    assert await page.locator("img").count() == 0
    assert await page.evaluate("typeof window.__xss") == "undefined"
    assert not page.dialogs


async def test_the_runs_tables_reason_column_is_readable_at_1400_px(env: ConsoleEnv, page: Any) -> None:
    """The reason column, the table's last, is on screen and wide enough to read in a 1400 px
    window (it was pushed past the edge by the run ids, dates and worker ids)."""
    from playwright.async_api import expect

    failed_id = await env.failed_compensation()  # its reason: "downstream refused"
    await env.db.execute("DELETE FROM awooop_refgw_fault")
    await env.db.execute(
        "UPDATE awooop_run_state SET worker_id = $2 WHERE run_id = $1",
        failed_id,
        "console-test-worker-" + "x" * 40,  # a long pod name, as Kubernetes makes them
    )
    await page.set_viewport_size({"width": 1400, "height": 900})
    try:
        await page.goto(f"{env.url}/projects/ops/runs")
        if await page.locator("form.signin").count():
            await sign_in(page, env.admin_key)
        await page.goto(f"{env.url}/projects/ops/runs")
        cell = page.locator(f"table.runs tr:has(a[href='/runs/{failed_id}']) td:last-child")
        await expect(cell).to_contain_text("downstream refused")
        box = await cell.bounding_box()
        assert box is not None
        assert box["x"] + box["width"] <= 1400, box  # on screen, not past the window's edge
        assert box["width"] >= 150, box  # a column, not a sliver
        page_width = await page.evaluate("document.documentElement.scrollWidth")
        assert page_width <= 1400, page_width  # the page itself does not scroll sideways
    finally:
        await page.set_viewport_size({"width": 1440, "height": 900})
