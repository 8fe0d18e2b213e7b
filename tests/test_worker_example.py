"""examples/worker.py (the README's worker) as a new user runs it: `awooop up`, then in a second
terminal (the venv not on PATH) the banner's export lines and `python examples/worker.py`, with
nothing set up by hand. The banner's grpcurl call sends the event; the worker scales `api` in the
`demo` project through the reference gateway (seeded by `awooop up`) and asks for approval; the
`awooop runs approve ...` line it prints is pasted as printed (and, for a first run, with
`reject` for `approve`): the rejected run is compensated (api back to 1 replica), the approved one
COMPLETED on its second claim without scaling again."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import asyncpg

from tests.harness.helpers import ROOT
from tests.harness.up import approval_asked, fresh_terminal_env, run_reaches, run_status, start_fresh_up

WORKER = "python examples/worker.py"  # the README's command


async def test_readme_worker_runs_the_demo_story_to_completed_and_to_compensated(
    db_dsn: str, redis_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    up = await start_fresh_up(tmp_path, db_dsn, redis_url)
    worker: asyncio.subprocess.Process | None = None
    try:
        assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = 'demo'") == 1
        with open(tmp_path / "worker.err", "wb") as err:
            worker = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                up.shell(WORKER),
                env=fresh_terminal_env(),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,  # the terminal's Ctrl-C / SIGTERM reaches the whole job
            )
        assert worker.stdout is not None
        _, send_event, _ = up.try_commands()

        async def story(update_id: str) -> tuple[str, str]:
            """Sends the banner's event (with this update_id); the run id and the line the worker prints."""
            assert worker is not None
            run_id, line = await approval_asked(up, send_event, worker, tmp_path / "worker.err", update_id)
            assert (await run_status(db, run_id))[0] == "WAITING_APPROVAL"
            return run_id, line

        # rejected: the scale is compensated back to 1 replica
        rejected, line = await story("1001")
        out = await up.paste(line.replace("awooop runs approve ", "awooop runs reject ", 1))
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"run {rejected} rejected"), out.stdout

        await run_reaches(db, rejected, "FAILED", "compensated", what="the rejected run's compensation")
        assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = 'demo'") == 1

        # approved: the worker's second claim completes it without scaling again
        approved, line = await story("1002")
        out = await up.paste(line)
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"run {approved} approved: now RESUMED"

        await run_reaches(db, approved, "COMPLETED", what="the approved run to complete")
        os.killpg(worker.pid, signal.SIGTERM)
        # an idle worker stops when its long-poll in flight ends (claim_wait, 20 s by default)
        assert await asyncio.wait_for(worker.wait(), 60) == 0
    finally:
        if worker is not None and worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
        code = await up.stop()
    assert code == 0, up.err()
    output: Any = json.loads(await db.fetchval("SELECT output FROM awooop_run_state WHERE run_id = $1", approved))
    assert output == {"kept": {"deployment": "api", "replicas": 3}}
    assert await db.fetchval("SELECT replicas FROM awooop_refgw_deployment WHERE project_id = 'demo'") == 3
    executed = await db.fetchval(
        "SELECT count(*) FROM awooop_refgw_request WHERE tool_id = 'k8s_scale_deployment' AND outcome = 'executed'"
    )
    assert executed == 3  # one scale per run, one scale back: the approved run's second claim skipped it
