"""The typed statement layer: for each statement file (`x.sql`, services/common/sql.py) a module
`x_sql.py` beside it, generated from the migrated store and committed (River generates its layer
with sqlc the same way). Run `scripts/gen-statements` after changing a statement or a migration;
tests/test_statement_types.py fails while a generated module is stale.

Per statement, by the mode its header names (`-- name: CompleteRun :one`, the modes of sqlc):
- `:one` a row or None (asyncpg fetchrow), `:many` a list of rows (fetch), `:val` the first
  column of the first row or None (fetchval), `:exec` the command tag (execute);
- a typed async function taking each parameter by name (and each `{{slot}}` as an int), and
- for `:one` and `:many`, a row type: a Protocol whose `row["column"]` is typed per column. The
  rows are asyncpg's Records, unchanged (no copy per row); only mypy sees the Protocol. A column
  the statement does not return reads as `object` (so a misspelt one fails where it is used), and
  the row still passes where code takes any row (services/common/db.py Row).

Why a small generator and not sqlc: sqlc's Python output is a plugin that emits SQLAlchemy code,
its parser would have to understand our `:name` parameters and `{{slot}}` variants, and its
analyzer does not follow our PL/pgSQL functions; Postgres itself describes each statement
exactly. libpq's describe (through psycopg) reports the parameter types, the result types and,
for a result column read straight from a table, that table column: its NOT NULL is the only
nullability a statement's result can be trusted with. A column is typed without None when it
comes from a NOT NULL table column and the statement has no outer join or set operation (either
can yield NULL where the table has none), or when the statement's header vouches for it
(`-- not null: total, run_id`: a count, a COALESCE, the outer side of a join; `awooop_run_state.*`:
that table's NOT NULL columns, for a UNION of its rows); every other column may be None. Parameters are typed
`T | None`, an array's elements too: SQL takes NULL for any parameter, and several statements mean it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
from psycopg import pq
from psycopg import sql as sql_ident

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from services.common import sql  # noqa: E402

SERVICES = ROOT / "services"
MODES = ("one", "many", "val", "exec")
_DDL = {"CREATE", "ALTER", "DROP"}
_NULLABLE_SHAPES = re.compile(r"\b(LEFT|RIGHT|FULL)\s+(OUTER\s+)?JOIN\b|\b(UNION|INTERSECT|EXCEPT)\b", re.I)

# Postgres type -> (the Python type asyncpg returns, the types a parameter takes)
_SCALARS: dict[str, tuple[str, str]] = {
    "bool": ("bool", "bool"),
    "int2": ("int", "int"),
    "int4": ("int", "int"),
    "int8": ("int", "int"),
    "oid": ("int", "int"),
    "float4": ("float", "float"),
    "float8": ("float", "float"),
    "numeric": ("Decimal", "Decimal | int"),
    "text": ("str", "str"),
    "varchar": ("str", "str"),
    "bpchar": ("str", "str"),
    "char": ("str", "str"),
    "name": ("str", "str"),
    "unknown": ("str", "str"),
    "uuid": ("UUID", "UUID | str"),
    "jsonb": ("Any", "object"),  # the pool's codec: JSON in and out as Python values (db.py)
    "json": ("str", "str"),
    "bytea": ("bytes", "bytes"),
    "timestamptz": ("datetime", "datetime"),
    "timestamp": ("datetime", "datetime"),
    "date": ("date", "date"),
    "interval": ("timedelta", "timedelta"),
    "void": ("None", "None"),
    "regclass": ("str", "str"),
}


@dataclass(frozen=True)
class Column:
    name: str
    pytype: str
    not_null: bool


@dataclass(frozen=True)
class Described:
    statement: sql.Statement
    mode: str
    params: tuple[tuple[str, str], ...]  # (name, parameter type)
    columns: tuple[Column, ...]


def snake(name: str) -> str:
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


def _is_ddl(st: sql.Statement) -> bool:
    code = [line for line in st.source.splitlines() if line.strip() and not line.lstrip().startswith("--")]
    return code[0].split(None, 1)[0].upper() in _DDL


class Describer:
    """Describes statements on one psycopg connection to a migrated store."""

    def __init__(self, conn: psycopg.Connection[tuple[object, ...]]) -> None:
        self.conn = conn
        self._types: dict[int, tuple[str, str]] = {}
        self._not_null: dict[tuple[int, int], bool] = {}

    def _type(self, oid: int) -> tuple[str, str]:
        """(result type, parameter type) of a type oid."""
        if oid not in self._types:
            row = self.conn.execute(
                "SELECT t.typname, e.typname FROM pg_type t LEFT JOIN pg_type e"
                " ON e.oid = t.typelem AND t.typcategory = 'A' WHERE t.oid = %s",
                (oid,),
            ).fetchone()
            assert row is not None, oid
            name, elem = str(row[0]), row[1]
            if elem is not None:
                inner = _SCALARS.get(str(elem), ("Any", "object"))
                # an array parameter's elements may be NULL too (a batch statement unnests them)
                element = inner[1] if inner[1] == "object" else f"{inner[1]} | None"
                self._types[oid] = (f"list[{inner[0]}]", f"Sequence[{element}]")
            else:
                self._types[oid] = _SCALARS.get(name, ("Any", "object"))
        return self._types[oid]

    def _column_not_null(self, table: int, col: int) -> bool:
        if table == 0 or col <= 0:
            return False
        key = (table, col)
        if key not in self._not_null:
            row = self.conn.execute(
                "SELECT attnotnull FROM pg_attribute WHERE attrelid = %s AND attnum = %s", (table, col)
            ).fetchone()
            self._not_null[key] = bool(row and row[0])
        return self._not_null[key]

    def _vouched(self, statement: sql.Statement) -> set[str]:
        """The columns the header vouches for; `table.*` stands for the table's NOT NULL columns
        (a UNION of the table's rows, whose nullability Postgres does not report)."""
        out: set[str] = set()
        for name in statement.not_null:
            if not name.endswith(".*"):
                out.add(name)
                continue
            rows = self.conn.execute(
                "SELECT a.attname FROM pg_attribute a WHERE a.attrelid = %s::regclass"
                " AND a.attnum > 0 AND NOT a.attisdropped AND a.attnotnull",
                (name.removesuffix(".*"),),
            ).fetchall()
            out.update(str(r[0]) for r in rows)
        return out

    def describe(self, statement: sql.Statement) -> Described:
        mode = statement.mode
        st = statement.samples_rendered()
        if _is_ddl(st):
            return Described(statement, mode, tuple((p, "object") for p in st.params), ())
        pg = self.conn.pgconn
        res = pg.prepare(b"", st.sql.encode())
        if res.status != pq.ExecStatus.COMMAND_OK:
            raise SystemExit(f"{statement.file} {statement.name}: {res.error_message.decode()}")
        d = pg.describe_prepared(b"")
        params = tuple((name, self._type(d.param_type(i))[1]) for i, name in enumerate(st.params))
        outer = bool(_NULLABLE_SHAPES.search(_code(st.source)))
        vouched = self._vouched(statement)
        columns: list[Column] = []
        seen: set[str] = set()
        for i in range(d.nfields):
            name = (d.fname(i) or b"").decode()
            if name in seen:
                continue  # a Record answers a repeated name with its first column
            seen.add(name)
            not_null = name in vouched or (not outer and self._column_not_null(d.ftable(i), d.ftablecol(i)))
            columns.append(Column(name, self._type(d.ftype(i))[0], not_null))
        unknown = vouched - seen
        if unknown:
            raise SystemExit(f"{statement.file} {statement.name}: -- not null names no result column {sorted(unknown)}")
        if mode in ("one", "many", "val") and not columns:
            raise SystemExit(f"{statement.file} {statement.name}: :{mode} but the statement returns no columns")
        return Described(statement, mode, params, tuple(columns))


def _code(source: str) -> str:
    """The statement without its comments (a comment may name LEFT JOIN in words)."""
    return "\n".join(line.split("--", 1)[0] for line in source.splitlines())


def _annotation(col: Column) -> str:
    if col.pytype in ("Any", "None") or col.not_null:
        return col.pytype
    return f"{col.pytype} | None"


def _row_class(d: Described) -> list[str]:
    name = f"{d.statement.name}Row"
    out = ["", "", f"class {name}(Protocol):", f'    """A row of {d.statement.name}."""', ""]
    for col in d.columns:
        out += [
            "    @overload",
            f'    def __getitem__(self, key: Literal["{col.name}"], /) -> {_annotation(col)}: ...',
        ]
    # any other name is `object`: a misspelt column read as a value fails type checking, and the
    # row still passes where code takes any row (db.Row)
    out += ["    @overload", "    def __getitem__(self, key: str, /) -> object: ...", ""]
    out.append("    def __getitem__(self, key: str, /) -> Any: ...")
    return out


def _function(d: Described) -> list[str]:
    st = d.statement
    const = snake(st.name).upper()
    fn = snake(st.name)
    args = [f"{p}: {t} | None" if t not in ("object", "None") else f"{p}: object" for p, t in d.params]
    args += [f"{s}: int" for s in st.slots]
    returns = {
        "one": f"{st.name}Row | None",
        "many": f"list[{st.name}Row]",
        # a value: None also when there is no row, unless the header vouches for the column
        "val": _annotation(Column("", d.columns[0].pytype, d.columns[0].name in st.not_null)) if d.columns else "None",
        "exec": "str",
    }[d.mode]
    method = {"one": "fetchrow", "many": "fetch", "val": "fetchval", "exec": "execute"}[d.mode]
    signature = ", ".join(["db: sql.Queryable", "/", "*", *args, "query_timeout: float | None = None"])
    doc = [line[3:] if line.startswith("-- ") else line[2:] for line in st.comment.splitlines()]
    doc = [wrapped for line in doc for wrapped in (textwrap.wrap(line, 110, break_on_hyphens=False) or [""])]
    out = ["", "", f"async def {fn}({signature}) -> {returns}:"]
    out.append(f'    """{st.name} ({st.file}).' + ("" if not doc else "\n\n    " + "\n    ".join(doc).rstrip()))
    out[-1] += '"""' if not doc else '\n    """'
    target = const
    if st.slots:
        out.append(f"    st = {const}.variant({', '.join(f'{s}={s}' for s in st.slots)})")
        target = "st"
    values = "".join(f", {p}" for p, _ in d.params)
    call = f"await db.{method}({target}.sql{values}, timeout=query_timeout)"
    if d.mode in ("one", "many"):
        out.append(f'    return cast("{returns}", {call})')
    elif d.mode == "val" and returns != "Any":
        out.append(f'    return cast("{returns}", {call})')
    else:
        out.append(f"    return {call}")
    return out


def module_text(path: Path, described: list[Described]) -> str:
    rel = path.relative_to(ROOT)
    body: list[str] = []
    for d in described:
        if d.mode in ("one", "many"):
            body += _row_class(d)
    consts = [f'{snake(d.statement.name).upper()} = Q["{d.statement.name}"]' for d in described]
    for d in described:
        body += _function(d)
    text = "\n".join(body)
    imports = ["from __future__ import annotations", ""]
    std = []
    if "Sequence[" in text:
        std.append("from collections.abc import Sequence")
    if "datetime" in text or "date" in re.findall(r"\bdate\b", text):
        names = sorted({n for n in ("date", "datetime", "timedelta") if re.search(rf"\b{n}\b", text)})
        std.append(f"from datetime import {', '.join(names)}")
    if re.search(r"\bDecimal\b", text):
        std.append("from decimal import Decimal")
    typing_names = sorted(
        {n for n in ("Any", "Literal", "Protocol", "cast", "overload") if re.search(rf"\b{n}\b", text)}
    )
    if typing_names:
        std.append(f"from typing import {', '.join(typing_names)}")
    if re.search(r"\bUUID\b", text):
        std.append("from uuid import UUID")
    head = [
        f'"""Generated from {rel.name} by scripts/gen-statements: do not edit (edit the .sql and regenerate)."""',
        "",
        *imports,
        *std,
        "",
        "from services.common import sql",
        "",
        f'Q = sql.load(__file__, "{path.name}")',
        *consts,
    ]
    return "\n".join(head + body) + "\n"


# Row types of whole tables, for code that maps any statement's row of that table: run_to_pb
# takes every statement's run (each returns all of awooop_run_state's columns, `r.*`). A statement's
# row is one of these when it has the table's columns with the same (or narrower) types: Protocols
# match by structure. Unlike a statement's row, a table row has no catch-all overload: mypy would
# then refuse every row with a column more than the table's.
TABLE_ROWS = {"RunRow": "awooop_run_state"}
TABLES_MODULE = SERVICES / "common" / "tables_sql.py"


def _tables_module(describer: Describer) -> str:
    body: list[str] = []
    for name, table in TABLE_ROWS.items():
        st = sql.Statement.parse(name.removesuffix("Row"), "(table)", f"SELECT * FROM {table}", "many")
        d = describer.describe(st)
        body += ["", "", f"class {name}(Protocol):", f'    """A row of {table}."""', ""]
        for col in d.columns:
            body += [
                "    @overload",
                f'    def __getitem__(self, key: Literal["{col.name}"], /) -> {_annotation(col)}: ...',
            ]
        body.append("    def __getitem__(self, key: str, /) -> Any: ...")
    text = "\n".join(body)
    head = [
        '"""Generated from the migrated store by scripts/gen-statements: do not edit (change a migration)."""',
        "",
        "from __future__ import annotations",
        "",
        *[
            line
            for line in (
                "from datetime import datetime",
                "from typing import Any, Literal, Protocol, overload",
                "from uuid import UUID",
            )
            if re.search(rf"\b{line.split()[-1]}\b", text)
        ],
    ]
    return "\n".join(head + body) + "\n"


def generate(dsn: str) -> dict[Path, str]:
    """The generated module of every statement file, by path."""
    out: dict[Path, str] = {}
    with psycopg.connect(dsn, autocommit=True) as conn:
        describer = Describer(conn)
        out[TABLES_MODULE] = _tables_module(describer)
        for path in sql.statement_files(SERVICES):
            statements = sql.Statements(path)
            described = [describer.describe(statements[name]) for name in statements]
            out[path.with_name(f"{path.stem}_sql.py")] = module_text(path, described)
    return out


def _format(files: dict[Path, str]) -> dict[Path, str]:
    """ruff format, as the rest of the tree (its output is what is committed)."""
    with tempfile.TemporaryDirectory() as tmp:
        paths = {}
        for i, (path, text) in enumerate(files.items()):
            p = Path(tmp) / f"m{i}.py"
            p.write_text(text)
            paths[path] = p
        ruff = Path(sys.executable).parent / "ruff"
        subprocess.run([str(ruff), "format", "-q", "--config", str(ROOT / "pyproject.toml"), tmp], check=True)
        return {path: p.read_text() for path, p in paths.items()}


def generated(dsn: str) -> dict[Path, str]:
    return _format(generate(dsn))


@contextlib.contextmanager
def scratch_database(server_dsn: str | None) -> Iterator[str]:
    """A new, empty database on server_dsn's server (an embedded Postgres when None), dropped after."""
    with contextlib.ExitStack() as stack:
        if server_dsn is None:
            from services.common.embedded import start_postgres

            data = stack.enter_context(tempfile.TemporaryDirectory(prefix="awooop-gen-"))
            pg = start_postgres(Path(data) / "pg")
            stack.callback(pg.stop)
            server_dsn = pg.dsn
        name = f"awooop_gen_{uuid.uuid4().hex[:10]}"
        with psycopg.connect(server_dsn, autocommit=True) as admin:
            admin.execute(sql_ident.SQL("CREATE DATABASE {}").format(sql_ident.Identifier(name)))
        parts = urlsplit(server_dsn)
        try:
            yield urlunsplit((parts.scheme, parts.netloc, "/" + name, parts.query, parts.fragment))
        finally:
            with psycopg.connect(server_dsn, autocommit=True) as admin:
                admin.execute(
                    sql_ident.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql_ident.Identifier(name))
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument(
        "dsn",
        nargs="?",
        default=os.environ.get("AWOOOP_TEST_DATABASE_URL"),
        help="a Postgres server for a scratch database (default: AWOOOP_TEST_DATABASE_URL, else an embedded one)",
    )
    args = parser.parse_args()
    from services.common import migrate

    with scratch_database(args.dsn) as dsn:
        asyncio.run(migrate.migrate(dsn))
        files = generated(dsn)
    for path, text in files.items():
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)}")
    for path in sorted(set(SERVICES.rglob("*_sql.py")) - set(files)):
        path.unlink()
        print(f"removed {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
