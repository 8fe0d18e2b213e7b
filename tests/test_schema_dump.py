"""services/common/schema.sql is the schema the migrations make: it is regenerated here (every
migration on a scratch embedded Postgres, then pg_dump) and must be the committed text."""

from __future__ import annotations

import difflib
import itertools

from services.common import schema_dump, sql


def test_schema_sql_is_current() -> None:
    text = schema_dump.render()
    committed = sql.SCHEMA_DUMP.read_text(encoding="utf-8")
    diff = difflib.unified_diff(committed.splitlines(), text.splitlines(), "committed", "migrated", lineterm="")
    shown = "\n".join(itertools.islice(diff, 60))
    assert text == committed, f"services/common/schema.sql is not current: run `{schema_dump.COMMAND}`\n{shown}"
    # what it is for: the current definitions the migrations redefined one after another ...
    for name in ("awooop_emit_run_event", "awooop_cancel_children", "awooop_append_run_event"):
        assert f"-- FUNCTION: {name}(" in text, name
    assert "-- TRIGGER: awooop_run_state awooop_run_release_concurrency_slot\n" in text
    # ... and none of the plan functions `awooop migrate` makes of the hot statements
    assert f"FUNCTION public.{schema_dump.PLAN_PREFIX}" not in text
