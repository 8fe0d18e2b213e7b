"""Throwaway PostgreSQL servers for the store-failure, pooler and failover tests: a primary
(initdb), streaming standbys (pg_basebackup -R), fast restarts, stops and promotion, each on
a free TCP port. The binaries come from the pgserver wheel (a test dependency), so CI needs
no Debian package; as root they run as a system user ('pgserver', created like pgserver does)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import asyncpg

from services.common.embedded import free_port

_OWNER = "pgserver"


def bindir() -> Path:
    import pgserver

    return Path(pgserver.__file__).parent / "pginstall" / "bin"


def _owner() -> tuple[int, int] | None:
    """(uid, gid) to run Postgres as, or None when we are not root."""
    if os.geteuid() != 0:
        return None
    import pwd

    try:
        entry = pwd.getpwnam(_OWNER)
    except KeyError:
        subprocess.run(["useradd", "-s", "/bin/bash", _OWNER], check=True, capture_output=True)
        entry = pwd.getpwnam(_OWNER)
    return entry.pw_uid, entry.pw_gid


def _run(args: list[str], *, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    # As root, drop to the owner with runuser rather than subprocess's user=: a fork that
    # changes ids from a process with gRPC threads can crash the child before exec.
    if _owner() is not None:
        args = ["runuser", "-u", _OWNER, "--", *args]
    env = {**os.environ, "LC_ALL": "C", "TZ": "UTC"}
    env.pop("PGDATA", None)
    proc = subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=env, cwd="/")
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:6])} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


@dataclass
class PgServer:
    data: Path
    port: int
    root: Path
    logfile: Path = field(init=False)

    def __post_init__(self) -> None:
        self.logfile = self.root / f"pg-{self.port}.log"

    @property
    def dsn(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def dsn_for(self, db: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def start(self) -> None:
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-w", "-t", "60", "start"])

    def stop(self, mode: str = "fast") -> None:
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"], check=False)

    def restart(self, mode: str = "fast") -> None:
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-l", str(self.logfile), "-m", mode, "-w", "restart"])

    def promote(self) -> None:
        _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "-w", "-t", "60", "promote"])

    def running(self) -> bool:
        return _run([str(bindir() / "pg_ctl"), "-D", str(self.data), "status"], check=False).returncode == 0

    def log(self) -> str:
        return self.logfile.read_text(errors="replace") if self.logfile.exists() else ""


@dataclass
class PgCluster:
    """A primary and any number of standbys under one temporary directory."""

    root: Path
    primary: PgServer
    standbys: list[PgServer] = field(default_factory=list)

    @classmethod
    def create(cls) -> PgCluster:
        root = Path(tempfile.mkdtemp(prefix="awooop-pgc-"))
        owner = _owner()
        if owner is not None:
            os.chown(root, *owner)
        root.chmod(0o755)
        data = root / "primary"
        _run([str(bindir() / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync", "-E", "UTF8"])
        port = free_port()
        conf = "\n".join(
            [
                "listen_addresses = '127.0.0.1'",
                f"port = {port}",
                "unix_socket_directories = ''",
                "fsync = off",
                "synchronous_commit = on",
                "full_page_writes = on",
                "wal_level = replica",
                "max_wal_senders = 5",
                "wal_keep_size = '64MB'",
                "hot_standby = on",
                "max_connections = 100",
                "shared_buffers = '32MB'",
                "",
            ]
        )
        with open(data / "postgresql.conf", "a") as f:
            f.write(conf)
        with open(data / "pg_hba.conf", "a") as f:
            f.write("host replication all 127.0.0.1/32 trust\n")
        primary = PgServer(data, port, root)
        primary.start()
        return cls(root, primary)

    def add_standby(self) -> PgServer:
        """A streaming standby of the primary (pg_basebackup -R writes standby.signal)."""
        data = self.root / f"standby{len(self.standbys) + 1}"
        _run(
            [
                str(bindir() / "pg_basebackup"),
                "-h",
                "127.0.0.1",
                "-p",
                str(self.primary.port),
                "-U",
                "postgres",
                "-D",
                str(data),
                "-R",
                "-X",
                "stream",
                "--no-sync",
                "-c",
                "fast",
            ]
        )
        port = free_port()
        with open(data / "postgresql.conf", "a") as f:
            f.write(f"\nport = {port}\n")
        standby = PgServer(data, port, self.root)
        standby.start()
        self.standbys.append(standby)
        return standby

    def destroy(self) -> None:
        for s in [*self.standbys, self.primary]:
            s.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)


async def wait_sql(dsn: str, sql: str = "SELECT 1", timeout: float = 30.0) -> object:
    """Runs sql once the server answers; polls with a deadline."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            conn = await asyncpg.connect(dsn, timeout=2)
            try:
                return await conn.fetchval(sql)
            finally:
                await conn.close()
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            import asyncio

            await asyncio.sleep(0.1)


async def create_migrated_db(server_dsn: str, name: str) -> str:
    """CREATE DATABASE name on the server and apply every migration; returns its DSN."""
    from urllib.parse import urlsplit, urlunsplit

    from services.common import migrate

    conn = await asyncpg.connect(server_dsn)
    try:
        await conn.execute(f'CREATE DATABASE "{name}"')
    finally:
        await conn.close()
    parts = urlsplit(server_dsn)
    dsn = urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
    await migrate.migrate(dsn)
    return dsn
