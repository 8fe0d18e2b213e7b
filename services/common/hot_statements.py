"""The statements the migration step creates plan functions for (services/common/server_plans.py):
what the keep_plan registry holds once every service module is imported (the statements marked
at import), plus the variants the scheduler renders per call, which the registry only learns
when a call renders them.

Variants covered: ClaimRuns for one project at every max_runs (1..MAX_CLAIM_RUNS), carrying
completions or not and with or without a claim id (one statement, services/scheduler/claims.sql):
what the worker SDK sends (it claims min(free slots, 100) runs of its projects); and CompleteRuns
(ClaimRuns for no project, marked at import). Claims over several projects are not covered (one
variant per project count and batch size would be thousands of functions); they run plain."""

from __future__ import annotations

import importlib
import pkgutil

import services
from services.common import server_plans


def _import_services() -> None:
    """Import every service module, so each marks its statements as it does in production."""
    for info in pkgutil.walk_packages(services.__path__, prefix="services."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)


def _render_claim_variants() -> None:
    # imported here: the scheduler imports services.common, never the other way at import time
    from services.scheduler import claiming
    from services.scheduler.claim_rpcs import MAX_CLAIM_RUNS

    for max_runs in range(1, MAX_CLAIM_RUNS + 1):
        claiming.claim_statement(1, max_runs)


def statements() -> list[str]:
    """Every statement that gets a plan function, in a stable order."""
    _import_services()
    _render_claim_variants()
    return server_plans.marked()
