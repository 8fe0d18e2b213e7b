"""A real PgBouncer (Debian's package; .ci/install-debian) started by a test on a free port,
in transaction mode unless told otherwise, in front of the test's Postgres. PgBouncer refuses
to run as root, so as root it runs as the same system user as tests/pgcluster.py."""

from __future__ import annotations

import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from services.common.embedded import free_port, wait_port
from tests.harness.infra import find_program, require_program
from tests.harness.pgcluster import _OWNER, _owner

SBIN = "/usr/sbin/pgbouncer"  # Debian's, not on a non-root user's PATH


def installed() -> bool:
    return find_program("pgbouncer", SBIN) is not None


@dataclass
class PgBouncer:
    proc: subprocess.Popen[bytes]
    port: int
    root: Path
    user: str = "postgres"

    def dsn_for(self, upstream_dsn: str) -> str:
        """upstream_dsn with host and port replaced by the pooler's."""
        parts = urlsplit(upstream_dsn)
        return f"postgresql://{parts.username or 'postgres'}@127.0.0.1:{self.port}{parts.path}"

    def admin(self, command: str) -> str:
        """Runs one command on PgBouncer's admin console (psql: the console speaks only the
        simple query protocol), e.g. RECONNECT: each server connection is closed once released."""
        done = subprocess.run(
            ["psql", "-h", "127.0.0.1", "-p", str(self.port), "-U", self.user, "-d", "pgbouncer", "-Atc", command],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def log(self) -> str:
        path = self.root / "pgbouncer.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)


def start_pgbouncer(upstream_dsn: str, *, pool_mode: str = "transaction", pool_size: int = 4) -> PgBouncer:
    exe = require_program("pgbouncer", SBIN)
    up = urlsplit(upstream_dsn)
    # the embedded Postgres of a machine without one listens on a unix socket (?host=/dir)
    host = parse_qs(up.query).get("host", [up.hostname or "127.0.0.1"])[0]
    root = Path(tempfile.mkdtemp(prefix="awooop-pgb-"))
    owner = _owner()
    port = free_port()
    user = up.username or "postgres"
    (root / "users.txt").write_text(f'"{user}" ""\n')
    (root / "pgbouncer.ini").write_text(
        "\n".join(
            [
                "[databases]",
                f"* = host={host} port={up.port or 5432}",
                "[pgbouncer]",
                "listen_addr = 127.0.0.1",
                f"listen_port = {port}",
                "unix_socket_dir =",
                "auth_type = trust",
                f"admin_users = {user}",
                f"auth_file = {root / 'users.txt'}",
                f"pool_mode = {pool_mode}",
                f"default_pool_size = {pool_size}",
                "max_client_conn = 500",
                "server_reset_query =",
                f"logfile = {root / 'pgbouncer.log'}",
                f"pidfile = {root / 'pgbouncer.pid'}",
                "",
            ]
        )
    )
    args = [exe, str(root / "pgbouncer.ini")]
    if owner is not None:
        for p in [root, *root.iterdir()]:
            os.chown(p, *owner)
        args = ["runuser", "-u", _OWNER, "--", *args]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd="/")
    bouncer = PgBouncer(proc, port, root, user)
    try:
        wait_port("127.0.0.1", port, timeout=15)
    except OSError:
        bouncer.stop()
        raise AssertionError(f"pgbouncer did not start:\n{bouncer.log()}") from None
    return bouncer
