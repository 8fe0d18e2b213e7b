"""Background loops and their blast radius: a failed pass never ends a loop, and a row whose
statement fails is isolated so the pass goes on for every other row and project.

Every failure is counted in awooop_loop_errors_total{loop, reason}:
- `store_unavailable`: the pass could not reach the store (an outage; the next pass retries);
- `pass_failed`: the pass raised anything else (a bug: the alert AwooopBackgroundLoopFailing
  pages when a loop has failed every pass for 2 minutes);
- `row_failed`: one row's statement failed; the pass skipped it and went on. The log line
  names the row, and the loop records the error where an operator looks (the run's history, the
  schedule's last_error).
Passes are counted in awooop_background_runs_total{loop, outcome} (ok / error).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import asyncpg
from prometheus_client import Counter

from services.common import loops_sql
from services.common.db import store_error
from services.common.observability import LOOP_RUNS, preset

log = logging.getLogger("awooop.loops")

STORE_UNAVAILABLE = "store_unavailable"
PASS_FAILED = "pass_failed"
ROW_FAILED = "row_failed"
REASONS = (STORE_UNAVAILABLE, PASS_FAILED, ROW_FAILED)

LOOP_ERRORS = Counter(
    "awooop_loop_errors_total", "Background loop failures: whole passes and isolated rows", ["loop", "reason"]
)


def register(name: str) -> None:
    """Exports the loop's series at 0 from start-up (so increase() sees the first failure)."""
    preset(LOOP_RUNS, (name,), ("ok", "error"))
    preset(LOOP_ERRORS, (name,), REASONS)


def pass_done(name: str) -> None:
    LOOP_RUNS.labels(name, "ok").inc()


def pass_failed(name: str, exc: BaseException) -> None:
    """Counts and logs a pass that raised (the loop goes on)."""
    LOOP_RUNS.labels(name, "error").inc()
    if store_error(exc) is not None:
        LOOP_ERRORS.labels(name, STORE_UNAVAILABLE).inc()
        log.warning("background loop: store unavailable", extra={"loop": name, "error": repr(exc)})
    else:
        LOOP_ERRORS.labels(name, PASS_FAILED).inc()
        log.error("background loop failed", exc_info=exc, extra={"loop": name})


def row_failed(name: str, row: str, exc: BaseException) -> None:
    """Counts and logs one isolated row (`row` names it, e.g. "run 85d5..."). A store outage is
    not a row's fault: it is raised again, to fail the pass."""
    if store_error(exc) is not None:
        raise exc
    LOOP_ERRORS.labels(name, ROW_FAILED).inc()
    log.error(
        "background loop: %s failed and was skipped; the pass goes on",
        row,
        exc_info=exc,
        extra={"loop": name, "row": row, "error": repr(exc)},
    )


MAX_ERROR_TEXT = 500


def describe(exc: BaseException) -> str:
    """What an operator reads: the error's type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:MAX_ERROR_TEXT]


R = TypeVar("R")


async def each_run(
    name: str,
    actor: str,
    pool: asyncpg.Pool,
    run_ids: list[uuid.UUID],
    one: Callable[[uuid.UUID], Awaitable[list[R]]],
) -> list[R]:
    """Runs the statement for one run at a time: a run whose statement fails is skipped, logged,
    counted and noted on its history; the others go on. Used after a batch statement failed
    for its data (poisoned)."""
    done: list[R] = []
    for run_id in run_ids:
        try:
            done += await one(run_id)
        except Exception as exc:
            row_failed(name, f"run {run_id}", exc)
            await loops_sql.record_loop_error(pool, run_id=run_id, actor=actor, error=describe(exc), loop=name)
    return done


async def in_batches(
    name: str,
    actor: str,
    pool: asyncpg.Pool,
    batch: int,
    statement: Callable[[uuid.UUID | None, int], Awaitable[list[R]]],
    due: Callable[[int], Awaitable[Sequence[uuid.UUID]]],
    settle: Callable[[list[R]], None],
) -> None:
    """Runs statement(None, batch) until a batch comes back short, settling each batch's rows. A
    batch that fails for its data is run again one run at a time: due(limit) lists the runs a
    batch would take, and statement(run_id, 1) restricts the same statement to one."""
    while True:
        try:
            rows = await statement(None, batch)
        except Exception as exc:
            if not poisoned(exc):
                raise
            ids = list(await due(batch))
            settle(await each_run(name, actor, pool, ids, lambda run_id: statement(run_id, 1)))
            return
        settle(rows)
        if len(rows) < batch:
            return


def poisoned(exc: BaseException) -> bool:
    """The statement failed for its data, not for the store: worth retrying row by row."""
    return store_error(exc) is None and not isinstance(exc, asyncio.CancelledError)


async def periodic(name: str, interval: float, fn: Callable[[], Awaitable[Any]], stopping: asyncio.Event) -> None:
    """Runs fn every interval (with 10 % jitter so replicas spread out) until stopping.
    A failed pass is logged and counted, never fatal."""
    register(name)
    while not stopping.is_set():
        try:
            await fn()
            pass_done(name)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            pass_failed(name, exc)
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=interval * random.uniform(0.9, 1.1))
