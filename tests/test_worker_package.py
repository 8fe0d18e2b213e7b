"""The client package a worker pod installs (packages/worker, `awooop-worker`), installed from its
wheel, and from its sdist (built from that directory alone), into a fresh venv as a platform team
would: it brings a gRPC client and protobuf only (no
database, cache, web or template library, no `services` package), and from that venv alone the
README's worker (examples/worker.py) runs the demo story against real services to COMPLETED and
to compensated, decided with that venv's `awooop runs approve|reject`."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from awooop.cli.main import SERVER_COMMANDS
from tests.harness.helpers import ROOT
from tests.harness.lock import locked_requirements
from tests.harness.up import approval_asked, fresh_terminal_env, run_reaches, start_fresh_up

# what `pip install awooop-worker` may bring: the package, grpcio and what it needs
ALLOWED = {
    "awooop-worker",
    "grpcio",
    "grpcio-status",
    "grpcio-health-checking",
    "protobuf",
    "googleapis-common-protos",
    "typing-extensions",  # grpcio's own requirement
    "pip",
    "setuptools",  # what the venv starts with
}
# named for the failure message: the server's libraries that must stay out of a worker pod
SERVER_ONLY = {"awooop", "asyncpg", "redis", "aiohttp", "jinja2", "croniter", "cryptography", "prometheus-client"}


def run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWOOOP_") and k != "VIRTUAL_ENV"}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=600, env=env, cwd=cwd)


def install_in_a_fresh_venv(tmp: Path, wheel: Path) -> Path:
    """A fresh venv with only this wheel and its requirements, at the versions uv.lock pins
    (hash-checked): what the lock promises a worker pod is what is tested."""
    venv = tmp / "venv"
    made = run([sys.executable, "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    requirements = locked_requirements("awooop-worker", tmp / "requirements.txt")
    installed = run([*pip, "--require-hashes", "--no-deps", "-r", str(requirements)], cwd=tmp)
    assert installed.returncode == 0, installed.stderr
    # the wheel's own requirements are met by the lock's set: nothing more is fetched
    installed = run([*pip, "--no-index", str(wheel)], cwd=tmp)
    assert installed.returncode == 0, installed.stderr
    return venv


def build_wheel(source: Path, out: Path) -> Path:
    """A wheel built from source (a directory or an sdist) with the locked setuptools, as the image does."""
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out)]
    built = run([*pip_wheel, str(source)])
    assert built.returncode == 0, built.stderr
    (wheel,) = out.glob("awooop_worker-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The awooop-worker wheel built from packages/worker, installed in a fresh venv."""
    tmp = tmp_path_factory.mktemp("worker-wheel")
    return install_in_a_fresh_venv(tmp, build_wheel(ROOT / "packages" / "worker", tmp))


@pytest.fixture(scope="module")
def sdist_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The awooop-worker sdist built from packages/worker, then a wheel built from that sdist alone
    (pip unpacks it outside the repository), installed in a fresh venv: the sdist is complete."""
    tmp = tmp_path_factory.mktemp("worker-sdist")
    build = f"from setuptools import build_meta; print(build_meta.build_sdist({str(tmp)!r}))"
    built = run([sys.executable, "-c", build], cwd=ROOT / "packages" / "worker")
    assert built.returncode == 0, built.stderr
    sdist = tmp / built.stdout.strip().splitlines()[-1]
    assert sdist.name.endswith(".tar.gz") and sdist.is_file(), built.stdout
    return install_in_a_fresh_venv(tmp, build_wheel(sdist, tmp / "wheel"))


@pytest.fixture(scope="module", params=["wheel_venv", "sdist_venv"])
def worker_venv(request: pytest.FixtureRequest) -> Path:
    """The client package installed from its wheel, and from its sdist."""
    venv: Path = request.getfixturevalue(request.param)
    return venv


def test_the_worker_package_installs_a_grpc_client_and_nothing_of_the_server(worker_venv: Path) -> None:
    python = str(worker_venv / "bin" / "python")
    listed = run([python, "-m", "pip", "list", "--format", "json"])
    assert listed.returncode == 0, listed.stderr
    names = {d["name"].lower().replace("_", "-") for d in json.loads(listed.stdout)}
    assert not names & SERVER_ONLY, f"the worker package pulled {names & SERVER_ONLY}"
    assert not {n for n in names if n.startswith("opentelemetry")}, names
    assert names <= ALLOWED, f"unexpected distributions: {names - ALLOWED}"
    # outside the repository (-I: no cwd or PYTHON* variables on the path): the venv's copy only
    probe = (
        "import importlib.util, awooop.worker\n"
        "from awooop.worker import Worker, RunContext, ToolClient\n"
        "from awooop.scheduler.v1 import scheduler_pb2\n"
        # reflection's descriptors and the stubs' .pyi files are package data: they came along
        "from importlib.resources import files\n"
        "assert files('awooop.common').joinpath('descriptors.binpb').is_file()\n"
        "assert files('awooop.scheduler.v1').joinpath('scheduler_pb2.pyi').is_file()\n"
        "assert importlib.util.find_spec('services') is None\n"
        # without the tracing extra, a tracer_provider is refused with what to install, not ignored
        "try:\n"
        "    Worker(lambda ctx: None, projects=['demo'], tracer_provider=object())\n"
        "except ValueError as exc:\n"
        "    assert \"pip install 'awooop-worker[tracing]'\" in str(exc), exc\n"
        "else:\n"
        "    raise AssertionError('a tracer_provider without OpenTelemetry was accepted')\n"
        "print(awooop.worker.__file__)\n"
    )
    out = run([python, "-I", "-c", probe], cwd=worker_venv)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().startswith(str(worker_venv)), out.stdout
    # the client half of the command works; the server half says what to install instead of a traceback
    awooop = str(worker_venv / "bin" / "awooop")
    assert run([awooop, "runs", "--help"]).returncode == 0


def listed_commands(awooop: str) -> set[str]:
    """The commands `awooop --help` offers."""
    helped = run([awooop, "--help"])
    assert helped.returncode == 0, helped.stderr
    return set(re.findall(r"^    (\w+) ", helped.stdout, re.M))


def test_a_client_only_install_lists_no_server_commands_and_says_what_to_install(worker_venv: Path) -> None:
    """The server's commands come from the server package's `awooop.cli_commands` entry points:
    without it, `awooop --help` offers none of them, and each says it needs the server package."""
    awooop = str(worker_venv / "bin" / "awooop")
    listed = listed_commands(awooop)
    assert {"runs", "health", "channels", "flow", "demo"} <= listed, listed
    assert not listed & set(SERVER_COMMANDS), listed
    for command in [["serve", "ingest"], ["up"], ["migrate"], ["config"], ["admin", "list"]]:
        answered = run([awooop, *command])
        assert answered.returncode == 2, (command, answered.stderr)
        assert f"`awooop {command[0]}` needs the server package (pip install awooop)" in answered.stderr
        assert "Traceback" not in answered.stderr, answered.stderr


def test_the_full_install_takes_the_server_commands_from_the_server_package() -> None:
    """With both packages (this environment) the entry points give the command every server command."""
    awooop = str(Path(sys.executable).parent / "awooop")
    assert set(SERVER_COMMANDS) <= listed_commands(awooop)
    configured = run([awooop, "config"])
    assert configured.returncode == 0, configured.stderr
    assert "AWOOOP_DATABASE_URL=" in configured.stdout


async def test_the_readme_worker_runs_from_the_worker_package_alone(
    wheel_venv: Path, db_dsn: str, redis_url: str, db: asyncpg.Connection, tmp_path: Path
) -> None:
    up = await start_fresh_up(tmp_path, db_dsn, redis_url)
    # after the banner's export lines: the worker venv first, so `python` and `awooop` are its own
    first = f"export PATH={wheel_venv / 'bin'}:$PATH"
    worker: asyncio.subprocess.Process | None = None
    try:
        with open(tmp_path / "worker.err", "wb") as err:
            worker = await asyncio.create_subprocess_exec(
                "bash",
                "-c",
                up.shell(f"{first}\npython examples/worker.py"),
                env=fresh_terminal_env(),
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=err,
                start_new_session=True,
            )
        _, send_event, _ = up.try_commands()

        async def story(update_id: str) -> tuple[str, str]:
            """Sends the banner's event (with this update_id); the run id and the line the worker prints."""
            assert worker is not None
            run_id, line = await approval_asked(up, send_event, worker, tmp_path / "worker.err", update_id)
            return run_id, line

        rejected, line = await story("2001")
        out = await up.paste(f"{first}\n" + line.replace("awooop runs approve ", "awooop runs reject ", 1))
        assert out.returncode == 0, out.stderr

        await run_reaches(db, rejected, "FAILED", "compensated", what="the rejected run's compensation")

        approved, line = await story("2002")
        out = await up.paste(f"{first}\n{line}")
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == f"run {approved} approved: now RESUMED"

        await run_reaches(db, approved, "COMPLETED", what="the approved run to complete")
        os.killpg(worker.pid, signal.SIGTERM)
        assert await asyncio.wait_for(worker.wait(), 60) == 0, (tmp_path / "worker.err").read_text()
    finally:
        if worker is not None and worker.returncode is None:
            os.killpg(worker.pid, signal.SIGKILL)
            await worker.wait()
        code = await up.stop()
    assert code == 0, up.err()
