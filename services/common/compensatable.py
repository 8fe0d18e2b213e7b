"""Which journal steps a compensation undoes, shared by the scheduler (which records a
compensation request when a run ends with such steps) and the saga driver (which undoes them):
a completed tool call with an undo command. 'compensating' counts too: a compensating call
was started and its outcome is not recorded yet, so the driver calls again with the same key.

The scheduler's named statements write the condition out (services/scheduler/*.sql, `comp`);
this fragment remains for the saga's statements until they are named (issue 26)."""

from __future__ import annotations


def compensatable_step(alias: str = "") -> str:
    """SQL condition on an awooop_saga_step row (alias: its table alias, or "" for none)."""
    a = f"{alias}." if alias else ""
    return f"""{a}step_type = 'tool_call' AND {a}compensation_cmd IS NOT NULL AND {a}compensation_cmd <> 'null'::jsonb
                  AND {a}status IN ('completed', 'compensating')"""
