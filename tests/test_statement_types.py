"""The typed statement layer (services/**/<file>_sql.py, scripts/statement_types.py) is what
scripts/gen-statements makes of the statement files on the migrated store: a statement, a
migration or the generator changed without regenerating fails here, with the command to run."""

from __future__ import annotations

import difflib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

import statement_types  # noqa: E402


def test_the_typed_layer_is_fresh(db_dsn: str) -> None:
    expected = statement_types.generated(db_dsn)
    committed = set(statement_types.SERVICES.rglob("*_sql.py"))
    stale = []
    for path, text in expected.items():
        have = path.read_text(encoding="utf-8") if path.exists() else ""
        if have != text:
            diff = "".join(difflib.unified_diff(have.splitlines(True), text.splitlines(True), str(path), "generated"))
            stale.append(diff[:2000])
    extra = sorted(str(p.relative_to(ROOT)) for p in committed - set(expected))
    assert not stale and not extra, (
        "the typed statement layer is stale: run scripts/gen-statements and commit the result\n"
        + "\n".join(stale)
        + (f"\nno statement file for {extra}" if extra else "")
    )


@pytest.mark.parametrize(
    ("sql_text", "expected"),
    [
        ("SELECT a FROM t LEFT JOIN u ON true", True),
        ("SELECT a FROM t -- a LEFT JOIN in words\n", False),
        ("SELECT a FROM t UNION ALL SELECT NULL", True),
        ("SELECT a FROM t JOIN u USING (a)", False),
    ],
)
def test_outer_joins_and_set_operations_make_every_column_nullable(sql_text: str, expected: bool) -> None:
    assert bool(statement_types._NULLABLE_SHAPES.search(statement_types._code(sql_text))) is expected
