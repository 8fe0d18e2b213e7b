"""Every list of statuses written out in SQL is one of the sets declared in
services/common/runstate.py and sagastate.py, so those modules own the sets and the SQL cannot keep
a twin that drifts.

It reads every .sql file: the named statements, every migration, and the current schema
(services/common/schema.sql, the store as the migrations leave it: its CHECK constraints, index
predicates, trigger conditions and functions). A list is `x IN (...)` / `NOT IN (...)`, an
`ARRAY[...]` or `ANY('{...}')` of literals (the form pg_dump writes CHECK constraints and index
predicates in), or the arms of a simple `CASE x WHEN 'A' ... WHEN 'B'`; it is a list of statuses
when every value is a status of one of the status enums. Each must equal a declared set: a status
enum, a tuple of statuses declared at module level (TERMINAL, LEASED, PLANNED, ...), or a
transition's allowed_from or to-statuses. A `CASE status WHEN '<status>' THEN '<audit action>'`
must, besides, map each status to the audit action of one transition's outcome.

A migration is never edited once applied, so a list a later migration replaced (a CHECK constraint
widened, a function redefined) is listed in SUPERSEDED with the migration that replaced it, and is
required to be absent from the current schema."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

import pytest

from services.common import runstate, sagastate, sql
from tests.harness.helpers import ROOT

SERVICES = ROOT / "services"
MIGRATIONS = SERVICES / "common" / "migrations"
FILES = [*sql.statement_files(SERVICES), *sorted(MIGRATIONS.glob("*.sql")), sql.SCHEMA_DUMP]

STATUS_ENUMS: tuple[type[StrEnum], ...] = (
    runstate.RunStatus,
    runstate.WaitStatus,
    sagastate.SagaStatus,
    sagastate.StepStatus,
    sagastate.RequestStatus,
)
STATUS_VALUES = {m.value for enum in STATUS_ENUMS for m in enum}


def _declared_sets() -> dict[frozenset[str], list[str]]:
    """Each declared set of statuses and the names it is declared under."""
    sets: dict[frozenset[str], list[str]] = {}

    def add(values: Iterable[object], name: str) -> None:
        sets.setdefault(frozenset(str(v) for v in values), []).append(name)

    for module in (runstate, sagastate):
        short = module.__name__.rsplit(".", 1)[-1]
        for name, value in vars(module).items():
            if isinstance(value, type) and value in STATUS_ENUMS:
                add(value, f"{short}.{name}")
            elif isinstance(value, tuple) and value and all(isinstance(v, STATUS_ENUMS) for v in value):
                add(value, f"{short}.{name}")
    for action, t in runstate.TRANSITIONS.items():
        add(t.allowed_from, f"runstate.TRANSITIONS[{action}].allowed_from")
        add(t.to_states, f"runstate.TRANSITIONS[{action}].to_states")
    for table in ("SAGA_TRANSITIONS", "STEP_TRANSITIONS", "REQUEST_TRANSITIONS"):
        for action, st in getattr(sagastate, table).items():
            add(st.allowed_from, f"sagastate.{table}[{action}].allowed_from")
            add(st.to, f"sagastate.{table}[{action}].to")
    sets.pop(frozenset(), None)
    return sets


DECLARED = _declared_sets()

# (migration, the list's values) -> the migration that replaced it, and how
SUPERSEDED: dict[tuple[str, frozenset[str]], str] = {
    (
        "0001_initial.sql",
        frozenset({"in_progress", "compensating", "compensated", "compensation_failed"}),
    ): "0080_saga_not_needed.sql: the saga_status CHECK constraint gains not_needed",
}


@dataclass(frozen=True)
class Listed:
    path: Path
    line: int
    values: tuple[str, ...]
    form: str  # "IN", "ARRAY", "ANY", "CASE"
    # a CASE's arms (the status each WHEN names, the literal its THEN gives, or None)
    arms: tuple[tuple[str, str | None], ...] = ()

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


_CODE = re.compile(r"'(?:[^']|'')*'|--[^\n]*")
_LITERAL = r"'(?:[^']|'')*'(?:::[a-z ]+)?"
_IN = re.compile(rf"\bIN\s*\(\s*({_LITERAL}(?:\s*,\s*{_LITERAL})*)\s*\)", re.I)
_ARRAY = re.compile(rf"\bARRAY\s*\[\s*({_LITERAL}(?:\s*,\s*{_LITERAL})*)\s*\]", re.I)
_ANY = re.compile(r"\bANY\s*\(\s*'\{([^}']*)\}'", re.I)
_CASE = re.compile(r"\bCASE\s+[A-Za-z_][\w.]*\s+(?=WHEN\b)", re.I)
_ARM = re.compile(r"\bWHEN\s+'([^']*)'\s+THEN\s+(?:'([^']*)')?", re.I)
_KEYWORD = re.compile(r"\b(CASE|END)\b", re.I)


def _without_comments(text: str) -> str:
    """The text with each `--` comment blanked (quoted text kept), so offsets and lines stay."""
    return _CODE.sub(lambda m: m.group(0) if m.group(0).startswith("'") else " " * len(m.group(0)), text)


def _values(listed: str) -> tuple[str, ...]:
    return tuple(v.replace("''", "'") for v in re.findall(r"'((?:[^']|'')*)'", listed))


def lists_of(path: Path) -> Iterator[Listed]:
    """Every written-out list of literals in the file."""
    text = _without_comments(path.read_text(encoding="utf-8"))

    def line(at: int) -> int:
        return text.count("\n", 0, at) + 1

    for form, pattern in (("IN", _IN), ("ARRAY", _ARRAY)):
        for m in pattern.finditer(text):
            yield Listed(path, line(m.start()), _values(m.group(1)), form)
    for m in _ANY.finditer(text):
        yield Listed(path, line(m.start()), tuple(v.strip('"') for v in m.group(1).split(",")), "ANY")
    for m in _CASE.finditer(text):
        depth, end = 1, len(text)
        for k in _KEYWORD.finditer(text, m.end()):
            depth += 1 if k.group(1).upper() == "CASE" else -1
            if depth == 0:
                end = k.start()
                break
        body = text[m.end() : end]
        # the arms of this CASE only: a nested CASE's are its own
        body = re.sub(r"\bCASE\b.*?\bEND\b", "", body, flags=re.S | re.I)
        arms = tuple((a.group(1), a.group(2)) for a in _ARM.finditer(body))
        yield Listed(path, line(m.start()), tuple(w for w, _ in arms), "CASE", arms)


def _status_lists(path: Path) -> list[Listed]:
    return [
        item
        for item in lists_of(path)
        if item.values
        and set(item.values) <= STATUS_VALUES
        # a simple CASE of one arm is an equality, not a list
        and (item.form != "CASE" or len(item.values) > 1)
    ]


def _nearest(values: frozenset[str]) -> str:
    # fewest values apart, then most in common, then a set declared by name before a transition's
    best = min(DECLARED, key=lambda s: (len(s ^ values), -len(s & values), len(DECLARED[s][0])))
    return f"{DECLARED[best][0]} = {sorted(best)}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_every_status_list_is_a_declared_set(path: Path) -> None:
    wrong = []
    for item in _status_lists(path):
        values = frozenset(item.values)
        if values in DECLARED or (path.name, values) in SUPERSEDED:
            continue
        wrong.append(
            f"{item.where}: {item.form} {sorted(values)} is no declared set; the nearest is {_nearest(values)}"
        )
    assert wrong == [], "\n".join(wrong)


def test_the_files_are_read() -> None:
    """The scan sees the lists it is meant to: the live CHECK constraint of the run's status, the
    claim's partial index, a migration's trigger function and a statement's CASE arms."""
    schema = _status_lists(sql.SCHEMA_DUMP)
    assert frozenset(runstate.STATUSES) in {frozenset(i.values) for i in schema if i.form == "ARRAY"}
    assert frozenset(runstate.CLAIMABLE) in {frozenset(i.values) for i in schema if i.form == "ARRAY"}
    trigger = _status_lists(MIGRATIONS / "0280_late_children.sql")
    assert frozenset(runstate.TERMINAL) in {frozenset(i.values) for i in trigger if i.form == "IN"}
    reaper = [i for i in _status_lists(SERVICES / "scheduler" / "reaper.sql") if i.form == "CASE"]
    assert {i.values for i in reaper} >= {("PENDING", "CANCELLED", "FAILED")}
    assert any(("PENDING", "REAPED") in i.arms for i in reaper)


def test_a_superseded_list_is_not_live() -> None:
    """Each exemption is of a list its migration writes, names a later migration that exists,
    and its values are in no list of the current schema."""
    live = {frozenset(i.values) for i in _status_lists(sql.SCHEMA_DUMP)}
    for (name, values), why in SUPERSEDED.items():
        written = {frozenset(i.values) for i in _status_lists(MIGRATIONS / name)}
        assert values in written, f"{name} has no list {sorted(values)}: drop the exemption"
        later = why.split(":", 1)[0]
        assert (MIGRATIONS / later).exists() and later > name, why
        assert values not in live, f"{name}'s {sorted(values)} is still in schema.sql"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(ROOT)) for p in FILES])
def test_a_case_of_statuses_gives_the_audit_action_of_one_transition(path: Path) -> None:
    """`CASE status WHEN 'PENDING' THEN 'REAPED' WHEN 'FAILED' THEN 'REAPED_FAILED' ...`: the
    arms are exactly the status-changing outcomes of one transition (to-status, audit action)."""
    audits = {a.value for a in runstate.Audit}
    runs = {s.value for s in runstate.STATUSES}
    outcomes = {
        action: {(o.to.value, o.audit.value) for o in t.outcomes if o.to is not None}
        for action, t in runstate.TRANSITIONS.items()
    }
    wrong = []
    for item in lists_of(path):
        pairs = {(w, a) for w, a in item.arms if w in runs and a in audits}
        if item.form != "CASE" or not pairs:
            continue
        if not any(pairs == got for got in outcomes.values()):
            wrong.append(f"{item.where}: {sorted(pairs)} are the outcomes of no transition of runstate.py")
    assert wrong == [], "\n".join(wrong)


def test_a_drifted_list_is_named_with_its_line_and_the_set_it_should_be(tmp_path: Path) -> None:
    """The check's own failure: a terminal list missing a status, on its line."""
    f = tmp_path / "drift.sql"
    f.write_text("-- name: X\nSELECT 1\n  FROM t\n WHERE status IN ('COMPLETED', 'FAILED')\n   AND k <> 'x'\n")
    (item,) = _status_lists(f)
    assert (item.line, item.values) == (4, ("COMPLETED", "FAILED"))
    assert frozenset(item.values) not in DECLARED
    assert _nearest(frozenset(item.values)).startswith("runstate.TERMINAL")
