"""Every named statement (services/common/sql.py) renders and plans against the migrated store:
PREPARE resolves its tables, columns, functions and parameter types, and EXPLAIN plans it, so a
statement that no longer fits the schema fails here rather than in a service. The statement files
are the one copy of the SQL (a change to one shows up in review as SQL); the typed functions
generated from them are checked fresh by tests/test_statement_types.py."""

from __future__ import annotations

import importlib
import pkgutil
from pathlib import Path

import asyncpg
import pytest

import services
from services.common import sql

ROOT = Path(services.__file__).parent
FILES = sql.statement_files(ROOT)
_DDL = {"CREATE", "ALTER", "DROP"}


def _import_everything() -> None:
    """Import every service module, so each loads its statement files as it does in production."""
    for info in pkgutil.walk_packages([str(ROOT)], prefix="services."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def test_there_are_statement_files() -> None:
    assert FILES, "no statement files under services/"


def test_every_statement_file_is_loaded_by_a_module() -> None:
    """A file no module loads is dead SQL (or a module reads SQL some other way)."""
    _import_everything()
    loaded = {p.resolve() for p in sql._loaded}
    assert [p.relative_to(ROOT) for p in FILES if p.resolve() not in loaded] == []


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
async def test_every_statement_plans_on_the_migrated_store(path: Path, db: asyncpg.Connection) -> None:
    """PREPARE and EXPLAIN EXECUTE each statement (all parameters NULL): names, types and
    parameter types resolve against the real schema; nothing is executed."""
    for name in (statements := sql.Statements(path)):
        st = statements[name].samples_rendered()
        code = [line for line in st.sql.splitlines() if line.strip() and not line.lstrip().startswith("--")]
        if code[0].split(None, 1)[0].upper() in _DDL:
            continue  # DDL cannot be prepared; the migration runner's tests run it
        async with db.transaction():
            try:
                await db.execute(f"PREPARE statement_check AS {st.sql}")
                nulls = ", ".join("NULL" for _ in st.params)
                plan = await db.fetch(f"EXPLAIN EXECUTE statement_check{f'({nulls})' if st.params else ''}")
            except asyncpg.PostgresError as exc:
                pytest.fail(f"{path.name} {name}: {type(exc).__name__}: {exc}")
            assert plan, name
            await db.execute("DEALLOCATE statement_check")


def test_parameters_are_named_and_numbered_by_first_use() -> None:
    st = sql.Statement.parse(
        "T", "t.sql", "SELECT :b::int, ':a', $$x$$, :a -- :c\n, :b, x::text, '10:30' FROM t WHERE c = :c"
    )
    assert st.params == ("b", "a", "c")
    assert st.sql.startswith("SELECT $1::int, ':a', $$x$$, $2 -- :c\n, $1, x::text, '10:30'")
    assert st.args(a=1, b=2, c=3) == (2, 1, 3)
    with pytest.raises(sql.StatementError, match="missing"):
        st.args(a=1, b=2)
    with pytest.raises(sql.StatementError, match="not a parameter"):
        st.args(a=1, b=2, c=3, d=4)


def test_a_slot_takes_an_integer_only() -> None:
    st = sql.Statement.parse("T", "t.sql", "-- slots: n=5\nSELECT * FROM t WHERE a = :a LIMIT {{n}}")
    assert st.samples_rendered().sql.endswith("LIMIT 5")
    assert st.variant(n=7).sql.endswith("WHERE a = $1 LIMIT 7")
    assert st.variant(n=7) is st.variant(n=7)
    with pytest.raises(sql.StatementError):
        st.variant(n="1; DROP TABLE t")  # type: ignore[arg-type]
    with pytest.raises(sql.StatementError):
        st.args(a=1)
