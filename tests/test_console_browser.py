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

from awooop.scheduler.v1 import scheduler_pb2
from awooop.worker import to_struct
from tests.harness import rpc_runs
from tests.harness.console import ROOT, ConsoleEnv, start_console_env, stop_console_env
from tests.harness.helpers import eventually

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
    # attempts that count against max_attempts: the crash cost one, the approval request none;
    # the lease generation (two claims) is shown apart
    await expect(page.locator("dl.fields")).to_contain_text("1 of 3")
    await expect(page.locator("dl.fields")).to_contain_text("lease generation")

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


# Words of a cell that the browser laid out over more than one line (a word broken inside, as
# "COMPLET ED"): for each word of each text node, the lines its characters' boxes sit on.
BROKEN_WORDS_JS = """
(cells) => {
  const broken = [];
  for (const cell of cells) {
    const walker = document.createTreeWalker(cell, NodeFilter.SHOW_TEXT);
    for (let node = walker.nextNode(); node; node = walker.nextNode()) {
      for (const m of node.textContent.matchAll(/\\S+/g)) {
        const range = document.createRange();
        range.setStart(node, m.index);
        range.setEnd(node, m.index + m[0].length);
        const lines = new Set([...range.getClientRects()].map((r) => Math.round(r.top)));
        if (lines.size > 1) broken.push(m[0]);
      }
    }
  }
  return broken;
}
"""


async def test_the_children_of_a_run_at_1400_px_counts_them_shows_their_steps_and_breaks_no_status(
    env: ConsoleEnv, page: Any
) -> None:
    """The runs list filtered to a run's four children in a 1400 px window: the counts are the
    children's (not the project's, where the parent and other runs are), each row names the step
    its parent started it under (as `awooop runs list --parent`), and no status, saga state or
    channel is broken inside a word even with long worker names and event ids pressing on the table."""
    from playwright.async_api import expect

    await env.failed_compensation()  # FAILED, compensation_failed: a project run, no child
    await env.db.execute("DELETE FROM awooop_refgw_fault")
    parent = await env.create()
    lease = await env.claim(parent)
    steps = [f"deploy-region-{r}-canary-then-full-rollout" for r in ("eu-west-1", "us-east-2", "ap-south-1", "sa-1")]
    specs = [scheduler_pb2.ChildRunSpec(step_id=s, input=to_struct({"step": s})) for s in steps]
    started = await env.worker.call(
        env.worker.scheduler.StartChildRuns, scheduler_pb2.StartChildRunsRequest(lease=lease, children=specs)
    )
    kids = {c.step_id: c.run_id for c in started.children}
    # of the children (the only claimable runs yet): one COMPLETED, one RUNNING under a long pod name
    done = await rpc_runs.claim_one(env.worker, "console-test-worker", "ops")
    await env.worker.call(env.worker.scheduler.CompleteRun, scheduler_pb2.CompleteRunRequest(lease=done))
    running = await rpc_runs.claim_one(env.worker, "console-test-worker-" + "x" * 40, "ops")
    assert {done.run_id, running.run_id} <= set(kids.values())
    for _ in range(3):  # the project's other runs, which the children's counts must leave out
        await env.create()
    await page.set_viewport_size({"width": 1400, "height": 900})
    try:
        await page.goto(f"{env.url}/projects/ops/runs")
        if await page.locator("form.signin").count():
            await sign_in(page, env.admin_key)
        await page.goto(f"{env.url}/projects/ops/runs")
        await expect(page.locator(".counts .total b")).to_have_text("9")  # the project: 4 + 1 + 1 + 3 runs
        assert await page.evaluate(BROKEN_WORDS_JS, await page.locator("table.runs td.word").element_handles()) == []

        await page.goto(f"{env.url}/runs/{parent}")
        await page.click(f"a[href='/projects/ops/runs?parent={parent}']")
        await expect(page.locator(".parent-filter")).to_contain_text(parent)
        counts = page.locator(".counts")
        await expect(counts.locator(".total")).to_have_text("children 4")
        await expect(counts.locator(".status-completed")).to_have_text("COMPLETED 1")
        await expect(counts.locator(".status-running")).to_have_text("RUNNING 1")
        await expect(counts.locator(".status-pending")).to_have_text("PENDING 2")
        await expect(counts.locator(".status-failed")).to_have_count(0)  # the project's failed run is no child
        await expect(page.locator("table.runs thead th")).to_contain_text(["run", "step", "status"])
        for step, run_id in kids.items():
            row = page.locator(f"table.runs tr:has(a[href='/runs/{run_id}'])")
            await expect(row.locator("td.step")).to_have_text(step)
        assert await page.evaluate(BROKEN_WORDS_JS, await page.locator("table.runs td.word").element_handles()) == []
        page_width = await page.evaluate("document.documentElement.scrollWidth")
        assert page_width <= 1400, page_width  # the page does not scroll sideways

        # a count is a filter of the children, not of the project
        await counts.locator(".status-pending").click()
        await expect(page.locator("table.runs tbody tr")).to_have_count(2)
        await expect(page.locator(".parent-filter")).to_contain_text(parent)
    finally:
        await page.set_viewport_size({"width": 1440, "height": 900})
    assert not page.dialogs


async def test_a_sleep_that_ended_shows_as_a_finished_sleep(env: ConsoleEnv, page: Any) -> None:
    """A durable sleep ends when its time is up: the run page says the sleep ended, not that a
    wait timed out (the audit row is the timeout's, with kind=sleep)."""
    from playwright.async_api import expect

    run_id, wait_id = await env.parked_on_wait(scheduler_pb2.WAIT_KIND_SLEEP, timeout_s=1)

    async def slept() -> bool:
        return bool(await env.db.fetchval("SELECT status FROM awooop_wait WHERE wait_id = $1::uuid", wait_id) != "open")

    await eventually(slept, timeout=30, what="the scheduler's sweep to end the sleep")
    await page.goto(f"{env.url}/runs/{run_id}")
    if await page.locator("form.signin").count():
        await sign_in(page, env.admin_key)
    timeline = page.locator("#timeline")
    await expect(timeline).to_contain_text("SLEEP_ENDED")
    await expect(timeline).not_to_contain_text("WAIT_TIMED_OUT")
    await expect(timeline).not_to_contain_text("timed_out")
    assert not page.dialogs
