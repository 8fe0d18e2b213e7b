"""`awooop up` as a real process for tests, and its banner's lines pasted into a second terminal
as a new user would: a shell whose PATH does not have the venv (only the banner's export lines
put it there)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import uuid
from dataclasses import dataclass
from pathlib import Path

import asyncpg

from services.common.embedded import free_port
from tests.harness.helpers import ROOT, eventually

SERVICES = {
    "ingest": "awooop.ingest.v1.IngestService",
    "scheduler": "awooop.scheduler.v1.SchedulerService",
    "saga": "awooop.saga.v1.SagaService",
    "gateway": "awooop.tools.v1.ToolGatewayService",
}
BIN = str(Path(sys.executable).parent)  # the venv's programs: awooop, grpcurl, python
PASTE_FIRST = "In another terminal, paste these first"


def fresh_terminal_env() -> dict[str, str]:
    """A new terminal's environment: no AWOOOP_* setting and no venv on PATH (`./dev test` put it there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_") and k != "VIRTUAL_ENV"}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p and p != BIN)
    return env


@dataclass
class Up:
    proc: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    ports: dict[str, int]

    def out(self) -> str:
        return self.out_path.read_text(errors="replace")

    def err(self) -> str:
        return self.err_path.read_text(errors="replace")

    def banner_value(self, pattern: str) -> str:
        m = re.search(pattern, self.out(), re.MULTILINE)
        assert m, f"{pattern!r} not in the banner:\n{self.out()}"
        return m.group(1)

    @property
    def key(self) -> str:
        return self.banner_value(r"^  export AWOOOP_API_KEY=(\S+)$")

    @property
    def dsn(self) -> str:
        return self.banner_value(r"^  postgres .*\n\s+(postgresql://\S+)$")

    def block(self, title: str) -> list[str]:
        """The commands under a banner heading, each with its continuation lines, as printed."""
        block = self.out().split(title, 1)[1].split("\n", 1)[1].split("\n\n", 1)[0]
        return [c.strip() for c in re.split(r"(?<!\\)\n", block) if c.strip()]

    def try_commands(self) -> list[str]:
        return self.block("Try:")

    def exports(self) -> list[str]:
        """The lines the banner says to paste first in another terminal."""
        return self.block(PASTE_FIRST)

    def shell(self, command: str) -> str:
        """command as pasted into a terminal after the banner's export lines."""
        return "\n".join([*self.exports(), command])

    async def paste(self, command: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(
            subprocess.run,
            ["bash", "-c", self.shell(command)],
            env=fresh_terminal_env(),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    async def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return await asyncio.to_thread(self.proc.wait, 60)


def child_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_")}
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env.update(extra)
    return env


async def start_up(data_dir: Path, tmp_path: Path, **env: str) -> Up:
    """`awooop up --data-dir data_dir` on free ports (every port setting given), once its banner is out."""
    ports = {name: free_port() for name in SERVICES}
    full = child_env(**{f"AWOOOP_{n.upper()}_PORT": str(p) for n, p in ports.items()}, **env)
    full.setdefault("AWOOOP_METRICS_PORT", str(free_port()))
    full.setdefault("AWOOOP_HTTP_PORT", str(free_port()))
    ports["http"] = int(full["AWOOOP_HTTP_PORT"])  # ingest's HTTP side (webhooks, run streams)
    full.setdefault("AWOOOP_CONSOLE_PORT", str(free_port()))
    n = len(list(tmp_path.glob("up-*.out")))
    out_path, err_path = tmp_path / f"up-{n}.out", tmp_path / f"up-{n}.err"
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awooop.cli", "up", "--data-dir", str(data_dir)],
            env=full,
            cwd=ROOT,
            stdout=out,
            stderr=err,
        )
    up = Up(proc, out_path, err_path, ports)

    async def ready() -> bool:
        assert proc.poll() is None, f"awooop up exited with {proc.returncode}:\n{up.out()}\n{up.err()}"
        return "Stop with Ctrl-C." in up.out()

    try:
        await eventually(ready, timeout=120, interval=0.2, what="the awooop up banner")
    except BaseException:
        proc.kill()
        proc.wait(10)
        raise
    return up


async def run_status(db: asyncpg.Connection, run_id: str) -> tuple[str, str]:
    """(status, saga_status) of a run; ("", "") when there is none."""
    row = await db.fetchrow("SELECT status, saga_status FROM awooop_run_state WHERE run_id = $1", run_id)
    return (row["status"], row["saga_status"]) if row else ("", "")


async def approval_asked(
    up: Up, send_event: str, worker: asyncio.subprocess.Process, worker_err: Path, update_id: str
) -> tuple[str, str]:
    """Pastes the banner's event command (with this update_id) and reads the README worker's next
    line, the approve command it prints for the run: (the run id, that line)."""
    out = await up.paste(send_event.replace('"update_id":1001', f'"update_id":{update_id}'))
    assert out.returncode == 0, out.stderr
    run_id = json.loads(out.stdout)["outcomes"][0]["run_id"]
    assert worker.stdout is not None
    try:
        line = (await asyncio.wait_for(worker.stdout.readline(), 60)).decode().strip()
    except TimeoutError:
        raise AssertionError(worker_err.read_text(errors="replace")) from None
    assert line.startswith(f"awooop runs approve {run_id} --token "), line
    return run_id, line


async def start_fresh_up(tmp_path: Path, db_dsn: str, redis_url: str) -> Up:
    """`./dev up` on the test's database and Redis, under a Redis prefix of its own: Redis outlives
    the test's database, and an earlier run's dedupe answers must not reach this one."""
    return await start_up(
        tmp_path / "data",
        tmp_path,
        AWOOOP_DATABASE_URL=db_dsn,
        AWOOOP_REDIS_URL=redis_url,
        AWOOOP_REDIS_PREFIX=f"awooop:{uuid.uuid4().hex}:",
    )


async def run_reaches(
    db: asyncpg.Connection, run_id: str, status: str, saga_status: str | None = None, *, what: str
) -> None:
    """Waits (30 s at most) until the run has this status (and saga status, when given)."""

    async def reached() -> bool:
        now = await run_status(db, run_id)
        return now[0] == status and (saga_status is None or now[1] == saga_status)

    await eventually(reached, timeout=30, what=what)
