"""Named SQL statements, read whole from `.sql` files (the form of River's and Procrastinate's
query files).

A statement file sits beside the module that runs its statements. Each statement starts
with a header line and runs to the next one:

    -- name: CompleteRun
    -- Lines of `--` comment right under the header say what the statement does.
    UPDATE awooop_run_state SET ... WHERE run_id = :run_id AND attempt_count = :attempt ...

Parameters are written by name (`:run_id`; a `::type` cast is not one). asyncpg takes them by
position, so the loader numbers them in the order they first appear (`:run_id` -> `$1`). Services
run a statement through its generated typed function (`x_sql.py`, scripts/statement_types.py),
which takes each parameter by name and passes them in that order. `Statement.args(run_id=...,
attempt=...)` returns the values in that order for code that runs a statement's text itself (the
tests' EXPLAINs and plan checks): a value can never be bound to the wrong position, and a
missing or unknown one fails at the call.

Variants. A few statements differ by a number written into the text rather than passed as a
parameter, because Postgres plans the literal better (the claim's `LIMIT`, for one). The rule
is one: a slot `{{max_runs}}` in the text is replaced by an integer, and nothing else ever is;
`Statement.variant(max_runs=10)` renders (and caches) one. A header line
`-- slots: max_runs=10` gives the value the statement is planned with in the tests.

Files are read once, at import of the module that names them (`load(__file__, "claims.sql")`);
a misspelt statement name fails at import. tests/test_sql_statements.py renders every
statement of every file and prepares and EXPLAINs it against the migrated store, so a name,
type or parameter that no longer resolves fails there.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeAlias

import asyncpg
from asyncpg.pool import PoolConnectionProxy

_HEADER = re.compile(r"^-- name: *([A-Za-z][A-Za-z0-9_]*) *(?::(one|many|val|exec))? *$", re.M)
# quoted text and comments are skipped whole, so `':x'` or `-- :x` never names a parameter
_TOKEN = re.compile(r"'(?:[^']|'')*'|\"(?:[^\"]|\"\")*\"|--[^\n]*|(?<![:\w]):([a-z_][a-z0-9_]*)\b")
_SLOT = re.compile(r"\{\{ *([a-z_][a-z0-9_]*) *\}\}")
_SLOTS_LINE = re.compile(r"^-- slots: *(.+)$", re.M)
# result columns the author vouches are never NULL where Postgres cannot tell (count(*), COALESCE,
# a column of an outer join's inner side): the typed layer types them without None
_NOT_NULL_LINE = re.compile(r"^-- not null: *(.+)$", re.M)


# What a generated statement function runs on: the pool, or a connection (its own or one the pool
# lent, inside a transaction of several statements).
Queryable: TypeAlias = asyncpg.Pool | asyncpg.Connection | PoolConnectionProxy


class StatementError(Exception):
    """A statement file or a call of a statement is wrong (a bug, never the caller's input)."""


def _number(text: str) -> tuple[str, tuple[str, ...]]:
    """`:name` -> `$n`, numbered by first appearance; returns the text and the names in order."""
    names: list[str] = []

    def sub(m: re.Match[str]) -> str:
        name = m.group(1)
        if name is None:  # quoted text or a comment: kept as written
            return m.group(0)
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    return _TOKEN.sub(sub, text), tuple(names)


@dataclass(frozen=True)
class Statement:
    """One named statement. `sql` is the text asyncpg runs ($n parameters), `params` the names
    in their positions, `source` the text as written in its file."""

    name: str
    file: str
    source: str
    sql: str
    params: tuple[str, ...]
    slots: tuple[str, ...] = ()
    # what a call returns (sqlc's modes): one row, many rows, one value, the command tag
    mode: str = ""
    not_null: tuple[str, ...] = ()
    # a slot's value the tests plan the statement with (-- slots: name=value)
    samples: Mapping[str, int] = field(default_factory=dict)
    _variants: dict[tuple[tuple[str, int], ...], Statement] = field(default_factory=dict, compare=False, repr=False)

    @property
    def comment(self) -> str:
        """The `--` lines right under the header: what the statement does."""
        lines = []
        for line in self.source.splitlines():
            if not line.startswith("--"):
                break
            if not line.startswith(("-- slots:", "-- not null:")):
                lines.append(line)
        return "\n".join(lines)

    @classmethod
    def parse(cls, name: str, file: str, source: str, mode: str = "") -> Statement:
        text = source.strip()
        samples: dict[str, int] = {}
        for line in _SLOTS_LINE.findall(text):
            for part in line.split(","):
                key, _, value = part.strip().partition("=")
                samples[key.strip()] = int(value)
        slots = tuple(dict.fromkeys(_SLOT.findall(text)))
        if set(samples) != set(slots):
            raise StatementError(f"{file} {name}: slots {slots} but samples for {sorted(samples)}")
        sql, params = _number(text) if not slots else (text, ())
        not_null = tuple(c.strip() for line in _NOT_NULL_LINE.findall(text) for c in line.split(",") if c.strip())
        return cls(name, file, text, sql, params, slots, mode=mode, not_null=not_null, samples=samples)

    def args(self, **values: object) -> tuple[object, ...]:
        """The values in parameter order; every parameter exactly once, by name."""
        if self.slots:
            raise StatementError(f"{self.name} has slots {self.slots}: run one of its variants")
        if set(values) != set(self.params):
            missing = sorted(set(self.params) - set(values))
            extra = sorted(set(values) - set(self.params))
            raise StatementError(f"{self.name}: missing {missing}, not a parameter {extra}")
        return tuple(values[p] for p in self.params)

    def variant(self, **slots: int) -> Statement:
        """This statement with each `{{slot}}` replaced by an integer (the only substitution)."""
        key = tuple(sorted(slots.items()))
        found = self._variants.get(key)
        if found is not None:
            return found
        if set(slots) != set(self.slots):
            raise StatementError(f"{self.name}: slots are {self.slots}, given {sorted(slots)}")
        for slot, value in slots.items():
            if type(value) is not int:
                raise StatementError(f"{self.name}: slot {slot} must be an int, not {value!r}")

        def fill(m: re.Match[str]) -> str:
            return str(slots[m.group(1)])

        text = _SLOT.sub(fill, self.source)
        sql, params = _number(text)
        rendered = Statement(
            f"{self.name}[{','.join(f'{k}={v}' for k, v in key)}]", self.file, text, sql, params, mode=self.mode
        )
        self._variants[key] = rendered
        return rendered

    def samples_rendered(self) -> Statement:
        """The variant the tests plan (the statement itself when it has no slots)."""
        return self.variant(**self.samples) if self.slots else self


class Statements(Mapping[str, Statement]):
    """The statements of one file, by name."""

    def __init__(self, path: Path) -> None:
        self.path = path
        text = path.read_text(encoding="utf-8")
        parts = _HEADER.split(text)
        if parts[0].strip() and not all(line.startswith("--") for line in parts[0].strip().splitlines()):
            raise StatementError(f"{path.name}: text before the first '-- name:' header")
        self._by_name: dict[str, Statement] = {}
        for name, mode, body in zip(parts[1::3], parts[2::3], parts[3::3], strict=True):
            if name in self._by_name:
                raise StatementError(f"{path.name}: {name} is defined twice")
            if not body.strip():
                raise StatementError(f"{path.name}: {name} is empty")
            self._by_name[name] = Statement.parse(name, path.name, body, mode or "")

    def __getitem__(self, name: str) -> Statement:
        try:
            return self._by_name[name]
        except KeyError:
            raise StatementError(f"{self.path.name} has no statement {name}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._by_name)

    def __len__(self) -> int:
        return len(self._by_name)


_loaded: dict[Path, Statements] = {}


def load(module_file: str, file_name: str) -> Statements:
    """The statements of file_name, in the directory of module_file (pass `__file__`)."""
    path = (Path(module_file).parent / file_name).resolve()
    found = _loaded.get(path)
    if found is None:
        found = _loaded[path] = Statements(path)
    return found


# The current schema, written by services/common/schema_dump.py: SQL, but no named statements.
SCHEMA_DUMP = Path(__file__).resolve().with_name("schema.sql")


def statement_files(root: Path) -> list[Path]:
    """Every statement file under root (migrations and the schema dump are not statement files)."""
    return sorted(p for p in root.rglob("*.sql") if "migrations" not in p.parts and p.resolve() != SCHEMA_DUMP)
