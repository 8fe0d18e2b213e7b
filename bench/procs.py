"""Services under test as real processes (`python -m awooop.cli serve <name>`), the same way
an operator runs them: access log off and WARNING logs so the numbers measure the service,
not its logging. Each process gets its own ports; its log goes to a file under a temp dir."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from services.common.embedded import free_port
from services.common.health import wait_serving

ROOT = Path(__file__).resolve().parent.parent
LOG_DIR = Path(tempfile.mkdtemp(prefix="awooop-bench-logs-"))
# set by `run.py --profile DIR`: every service process is sampled by py-spy into DIR
PROFILE_DIR: Path | None = None
# set by `run.py --profile-native`: py-spy also samples native frames (grpc's C core, syscalls);
# it then stops the process for each sample, so the figures of that run are not comparable
PROFILE_NATIVE = False
# set by `run.py --uvloop / --set NAME=VALUE`: settings every service process gets
EXTRA_SETTINGS: dict[str, str] = {}
# set by `run.py --tracing`: OTEL_* variables every service process gets
EXTRA_ENV: dict[str, str] = {}


@dataclass
class Service:
    name: str
    proc: subprocess.Popen[bytes]
    port: int
    metrics_port: int
    log_path: Path
    profiler: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def pid(self) -> int:
        return self.proc.pid

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout: float = 10) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        if self.profiler is not None:  # py-spy writes its file when the target exits
            try:
                self.profiler.wait(30)
            except subprocess.TimeoutExpired:
                self.profiler.kill()


async def wait_healthy(address: str, timeout: float = 30.0) -> None:
    if not await wait_serving(address, timeout):
        raise RuntimeError(f"service at {address} not healthy after {timeout}s")


def service_env(database_url: str, redis_url: str, redis_prefix: str, **settings: object) -> dict[str, str]:
    env = {
        "AWOOOP_DATABASE_URL": database_url,
        "AWOOOP_REDIS_URL": redis_url,
        "AWOOOP_REDIS_PREFIX": redis_prefix,
        "AWOOOP_ACCESS_LOG": "false",
        "AWOOOP_LOG_LEVEL": "WARNING",
        "AWOOOP_SHUTDOWN_GRACE": "1",
    }
    env.update({f"AWOOOP_{k.upper()}": v for k, v in EXTRA_SETTINGS.items()})
    for k, v in settings.items():
        env[f"AWOOOP_{k.upper()}"] = ("true" if v else "false") if isinstance(v, bool) else str(v)
    return env


async def spawn(name: str, env: dict[str, str], tag: str = "") -> Service:
    """Starts one service process and waits until its health check says SERVING."""
    port, metrics_port = free_port(), free_port()
    full_env = {
        **os.environ,
        "AWOOOP_HTTP_PORT": str(free_port()),  # the ingest HTTP port, unless env names one
        **env,
        **EXTRA_ENV,
        f"AWOOOP_{name.upper()}_PORT": str(port),
        "AWOOOP_METRICS_PORT": str(metrics_port),
    }
    log_path = LOG_DIR / f"{name}{'-' + tag if tag else ''}-{port}.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "awooop.cli", "serve", name],
            env=full_env,
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    svc = Service(name, proc, port, metrics_port, log_path)
    try:
        await wait_healthy(svc.address)
    except RuntimeError:
        svc.kill()
        raise RuntimeError(f"{name} did not start:\n{svc.log()[-3000:]}") from None
    if PROFILE_DIR is not None:
        svc.profiler = start_profiler(proc.pid, PROFILE_DIR / f"{name}{'-' + tag if tag else ''}-{port}")
    return svc


async def spawn_journal_saga(database_url: str, redis_url: str, redis_prefix: str, key: str, tag: str = "") -> Service:
    """A saga service for the journal alone: it is SERVING only with an internal key, and with no
    tool gateway (an address nothing listens on; the journal needs none) its key check has no
    verdict, so `key` may be any valid one."""
    env = service_env(database_url, redis_url, redis_prefix, internal_api_key=key, gateway_addr="127.0.0.1:1")
    return await spawn("saga", env, tag)


def start_profiler(pid: int, stem: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling `pid` until it exits: collapsed stacks in <stem>.txt (read them with
    `python -m bench.profile <stem>.txt`) and a flame graph in <stem>.svg is left to py-spy."""
    import shutil

    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("py-spy not found (pip install py-spy); not profiling", file=sys.stderr)
        return None
    stem.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [spy, "record", "--pid", str(pid), "--rate", "250", "--format", "raw", "-o", f"{stem}.txt"]
        + (["--native"] if PROFILE_NATIVE else ["--nonblocking"]),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def scrape_metrics(svc: Service) -> dict[str, float]:
    """The service's Prometheus samples, name{labels} -> value (empty if unreachable)."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{svc.metrics_port}/metrics", timeout=2) as r:
            text = r.read().decode()
    except OSError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        key, _, value = line.rpartition(" ")
        try:
            out[key] = float(value)
        except ValueError:
            continue
    return out
