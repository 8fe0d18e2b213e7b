"""The scheduler's hot statements, those the migration step creates plan functions for
(services/common/server_plans.py; the step finds this list through the `awooop.hot_statements`
entry point, pyproject.toml): what the keep_plan registry holds once every scheduler module is
imported (the statements marked at import), plus the variants the scheduler renders per call,
which the registry only learns when a call renders them.

Variants covered: ClaimRuns for one project at every max_runs (1..MAX_CLAIM_RUNS), carrying
completions or not and with or without a claim id (one statement, services/scheduler/claims.sql):
what the worker SDK sends (it claims min(free slots, 100) runs of its projects); and CompleteRuns
(ClaimRuns for no project, marked at import). Claims over several projects are not covered (one
variant per project count and batch size would be thousands of functions); they run plain."""

from __future__ import annotations

import importlib
import pkgutil

import services.scheduler
from services.common import server_plans
from services.scheduler import claiming
from services.scheduler.claim_rpcs import MAX_CLAIM_RUNS


def statements() -> list[str]:
    """Every statement of the scheduler that gets a plan function, in a stable order."""
    for info in pkgutil.walk_packages(services.scheduler.__path__, prefix="services.scheduler."):
        if not info.name.endswith("__main__"):  # each marks its statements as it does in production
            importlib.import_module(info.name)
    for max_runs in range(1, MAX_CLAIM_RUNS + 1):
        claiming.claim_statement(1, max_runs)
    return server_plans.marked()
