"""What the WAL of one store-cost window is made of:
`python -m bench.wal_composition [--runs N] [--by-type]`.

Runs bench/store_cost.py's two cycles (awooop: ingest → claim → heartbeat → one journaled step →
complete; PgQueuer: enqueue → dequeue → complete) on the configured Postgres, and prints
pg_waldump's per-record statistics of each window, per completed item, then the same by table
and index (with --by-type, also by record type within each). It reads the server's
WAL files, so it runs on the database host, as a user that can read the data directory, on a
quiet machine (the WAL is the whole server's). AWOOOP_DATABASE_URL / AWOOOP_REDIS_URL (or the
test variables) name the stores.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import asyncpg

from bench import env, store_cost
from bench.config import Config

SLOT = "awooop_wal_composition"


async def _server(dsn: str) -> tuple[Path, Path]:
    """The server's pg_wal directory and its pg_waldump (found beside its pg_config's BINDIR)."""
    conn = await asyncpg.connect(dsn)
    try:
        data = Path(await conn.fetchval("SHOW data_directory"))
        major = int(await conn.fetchval("SHOW server_version_num")) // 10000
    finally:
        await conn.close()
    found = shutil.which("pg_waldump") or f"/usr/lib/postgresql/{major}/bin/pg_waldump"
    return data / "pg_wal", Path(found)


def _lsn(b: int) -> str:
    return f"{b >> 32:X}/{b & 0xFFFFFFFF:X}"


# a row of pg_waldump --stats=record: "Heap/INSERT   102 ( 73.91)   6160 ( 65.16)   2724 (  3.16) ..."
_ROW = re.compile(r"^(?P<type>\S+/\S+)\s+(?P<n>\d+)\s+\(\s*[\d.]+\)\s+(?P<rec>\d+)\s+\(\s*[\d.]+\)\s+(?P<fpi>\d+)")


def _stats(waldump: Path, wal_dir: Path, start: int, end: int, items: int) -> list[dict[str, Any]]:
    """pg_waldump --stats=record between two LSNs: per record type, records, record bytes and
    full-page-image bytes per item."""

    out = subprocess.run(
        [str(waldump), "--stats=record", "-p", str(wal_dir), "-s", _lsn(start), "-e", _lsn(end)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    rows = []
    for line in out.splitlines():
        m = _ROW.match(line)
        if m is None:
            continue
        count, rec, fpi = int(m["n"]), int(m["rec"]), int(m["fpi"])
        rows.append(
            {
                "type": m["type"],
                "per_item": round(count / items, 2),
                "record_bytes": round(rec / items),
                "fpi_bytes": round(fpi / items),
            }
        )
    return sorted(rows, key=lambda r: -(r["record_bytes"] + r["fpi_bytes"]))


# a record of plain pg_waldump:
# "rmgr: Btree len (rec/tot): 64/ 64, ... desc: INSERT_LEAF off 2, blkref #0: rel 1663/5/16390 blk 1"
_RECORD = re.compile(
    r"rmgr: (?P<rmgr>\S+)\s+len \(rec/tot\):\s*\d+/\s*(?P<tot>\d+),.*?desc: (?P<desc>[A-Z_+0-9]+)"
    r".*?blkref #0: rel \d+/\d+/(?P<node>\d+)"
)


def _by_relation(
    waldump: Path,
    wal_dir: Path,
    start: int,
    end: int,
    items: int,
    names: dict[int, str],
    by_type: bool = False,
) -> list[tuple[str, float, int]]:
    """The same window's records by the relation of their first block (and, with by_type, by record
    type within it): (name, records per item, bytes per item, full-page images included). Records
    of no relation (commits) are left out."""
    out = subprocess.run(
        [str(waldump), "-p", str(wal_dir), "-s", _lsn(start), "-e", _lsn(end)],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    count: dict[str, int] = {}
    size: dict[str, int] = {}
    for line in out.splitlines():
        m = _RECORD.search(line)
        if m is None:
            continue
        name = names.get(int(m["node"]), f"other relation {m['node']}")
        if by_type:
            name = f"{name} {m['rmgr']}/{m['desc']}"
        count[name] = count.get(name, 0) + 1
        size[name] = size.get(name, 0) + int(m["tot"])
    return sorted(((n, round(count[n] / items, 2), round(size[n] / items)) for n in count), key=lambda r: -r[2])


async def main(runs: int, by_type: bool) -> None:
    stores = await env.resolve(
        os.environ.get("AWOOOP_DATABASE_URL") or os.environ.get("AWOOOP_TEST_DATABASE_URL"),
        os.environ.get("AWOOOP_REDIS_URL") or os.environ.get("AWOOOP_TEST_REDIS_URL"),
    )
    try:
        wal_dir, waldump = await _server(stores.pg_dsn)
        cfg = Config.quick_mode()
        conn = await asyncpg.connect(stores.pg_dsn)
        # a slot keeps the windows' WAL segments from being recycled by a checkpoint until read
        await conn.execute("SELECT pg_create_physical_replication_slot($1, true)", SLOT)
        try:
            for name, cycle in (("pgqueuer", store_cost._pgqueuer), ("awooop", store_cost._awooop)):
                got = await cycle(stores, cfg, runs)
                start, end = got["lsn"]
                _print(name, got, _stats(waldump, wal_dir, start, end, runs))
                _print_relations(_by_relation(waldump, wal_dir, start, end, runs, got["relations"]))
                if by_type:
                    _print_relations(_by_relation(waldump, wal_dir, start, end, runs, got["relations"], True))
        finally:
            await conn.execute("SELECT pg_drop_replication_slot($1)", SLOT)
            await conn.close()
    finally:
        await stores.cleanup()


def _print(name: str, got: dict[str, Any], rows: list[dict[str, Any]]) -> None:
    print(f"\n{name}: {got['wal_bytes']} B of WAL per item, {got['pg_cpu_ms']} ms of Postgres CPU")
    for table, w in got.get("writes_per_run", {}).items():
        print(f"  {table:40} {w}")
    print(f"{'record type':32} {'per item':>9} {'bytes':>7} {'fpi':>7}")
    for r in rows:
        if r["record_bytes"] + r["fpi_bytes"] >= 10:
            print(f"{r['type']:32} {r['per_item']:>9} {r['record_bytes']:>7} {r['fpi_bytes']:>7}")


def _print_relations(rows: list[tuple[str, float, int]]) -> None:
    print(f"{'relation (first block)':48} {'records':>8} {'bytes':>7}")
    for name, n, size in rows:
        if size >= 10:
            print(f"{name:48} {n:>8} {size:>7}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2000)
    parser.add_argument("--by-type", action="store_true", help="also each relation's records by type")
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.by_type))
