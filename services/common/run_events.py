"""The sources of a run's event log (awooop_run_event.source, migration 0180), declared once:
WatchRun's stream, the SDK and the CLI name them by these values."""

from __future__ import annotations

from enum import StrEnum


class EventSource(StrEnum):
    """Where a row of a run's log comes from."""

    STATE = "state"  # a state change: a copy of one of the run's audit rows (kind: its action)
    STEP = "step"  # a journal step's record or status change (kind: the step's status)
    PROGRESS = "progress"  # a progress event the handler emitted (ctx.emit; kind: the handler's)


class EmitOutcome(StrEnum):
    """What awooop_emit_run_event answered."""

    EMITTED = "emitted"
    DUPLICATE = "duplicate"  # the emit key was used before: the first event's offset
    EXHAUSTED = "exhausted"  # past the run's bounds: nothing written
    LEASE_LOST = "lease_lost"  # no live lease with that token


# The kind of a token stream's checkpoint row (a progress row PublishTokens writes; its data: stream,
# attempt, first_seq, last_seq, tokens). WatchRun, the CLI and the console read it by this name.
STREAM_CHECKPOINT = "stream_checkpoint"
